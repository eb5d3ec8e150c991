// The C ABI's steps (muonps_c.h): a step with the step's own values, one
// with per-group values by index (and a CUDA trainer's stream), the end of
// an async step, and a CUDA trainer's word that one gradient is final.
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/muonps_c.h"
#include "client/muonps_c_internal.h"

namespace {

using muonps::client_internal::Record;

int Finish(muonps_client* c, const absl::StatusOr<muonps::StepResult>& step,
           muonps_step_result* result) {
  if (!step.ok()) return Record(c, step.status());
  if (result != nullptr) {
    result->pending = step->pending ? 1 : 0;
    result->already_applied = step->already_applied ? 1 : 0;
    result->seconds = step->seconds;
    result->bytes_moved = step->bytes_moved;
    result->momentum_reset = step->momentum_reset;
    result->plan_version = step->plan_version;
    result->adamw_applied = step->adamw_applied ? 1 : 0;
    result->repaired = step->repaired ? 1 : 0;
  }
  return Record(c, absl::OkStatus());
}

// values[g], or -1 (keep the step's) for a NULL array.
double At(const double* values, int g) {
  return values == nullptr ? -1.0 : values[g];
}

}  // namespace

extern "C" {

int muonps_client_step(muonps_client* c, int64_t step_id, double lr,
                       double weight_decay, double adamw_lr,
                       muonps_step_result* result) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  muonps::StepOptions options;
  options.lr = lr;
  options.weight_decay = weight_decay;
  options.adamw_lr = adamw_lr;
  return Finish(c, c->client->Step(step_id, options), result);
}

int muonps_client_step_with(muonps_client* c, int64_t step_id,
                            const muonps_step_options* o,
                            muonps_step_result* result) {
  if (c == nullptr || o == nullptr) return MUONPS_INVALID_ARGUMENT;
  // Checked before any array is read: at most MUONPS_MAX_GROUPS entries.
  if (o->group_count < 0 || o->group_count > MUONPS_MAX_GROUPS) {
    return Record(c, absl::InvalidArgumentError(absl::StrCat(
                         "group_count: ", o->group_count, " is not in [0, ",
                         MUONPS_MAX_GROUPS, "]")));
  }
  if (o->async < 0 || o->async > 2) {
    return Record(c, absl::InvalidArgumentError(absl::StrCat(
                         "async: ", o->async, " is not 0, 1 or 2")));
  }
  muonps::StepOptions options;
  options.lr = o->lr;
  options.weight_decay = o->weight_decay;
  options.adamw_lr = o->adamw_lr;
  options.stream = reinterpret_cast<CUstream_st*>(o->stream);
  options.async = o->async != 0;
  options.forward_waits = o->async == 2;
  options.groups.resize(o->group_count);
  for (int g = 0; g < o->group_count; ++g) {
    muonps::GroupHyperparameters& group = options.groups[g];
    group.lr = At(o->group_lr, g);
    group.weight_decay = At(o->group_weight_decay, g);
    group.adamw_lr = At(o->group_adamw_lr, g);
    group.adamw_weight_decay = At(o->group_adamw_weight_decay, g);
  }
  return Finish(c, c->client->Step(step_id, options), result);
}

int muonps_client_gradient_ready(muonps_client* c, const char* name,
                                 void* stream) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  const absl::Status status =
      c->client->GradientReady(name, static_cast<CUstream_st*>(stream));
  // Success leaves the last error alone: this call may run beside another
  // on the handle (a gradient hook's thread), which owns it.
  if (status.ok()) return MUONPS_OK;
  return Record(c, status);
}

int muonps_client_place_gradient(muonps_client* c, const char* name,
                                 uint64_t grad_ptr) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Record(c, c->client->PlaceGradient(
                       name, reinterpret_cast<const void*>(grad_ptr)));
}

int muonps_client_allocate_gradient(muonps_client* c, const char* name,
                                    uint64_t* out) {
  if (c == nullptr || name == nullptr || out == nullptr) {
    return MUONPS_INVALID_ARGUMENT;
  }
  *out = 0;
  absl::StatusOr<void*> memory = c->client->AllocateGradient(name);
  if (!memory.ok()) return Record(c, memory.status());
  *out = reinterpret_cast<uint64_t>(*memory);
  return MUONPS_OK;
}

int muonps_free_cuda_memory(uint64_t ptr) {
  const absl::Status freed =
      muonps::Client::FreeCudaMemory(reinterpret_cast<void*>(ptr));
  return freed.ok() ? MUONPS_OK : MUONPS_INVALID_ARGUMENT;
}

int muonps_client_wait_for_parameters(muonps_client* c, void* stream,
                                      int64_t matrices) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  const absl::Status status =
      c->client->WaitForParameters(static_cast<CUstream_st*>(stream), matrices);
  return status.ok() ? MUONPS_OK : Record(c, status);
}

int muonps_client_wait(muonps_client* c, muonps_step_result* result) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Finish(c, c->client->Wait(), result);
}

}  // extern "C"
