// The C ABI's saved state (muonps_c.h): the momentum of the local worker's
// matrices, the client's AdamW moments and step counts, and the workers'
// momentum checkpoints.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/muonps_c.h"
#include "client/muonps_c_internal.h"

namespace {

using muonps::client_internal::Record;

}  // namespace

extern "C" {

int muonps_client_get_momentum(muonps_client* c, const char* name,
                               int64_t expert, float* out, int64_t count) {
  if (c == nullptr || name == nullptr || out == nullptr) {
    return MUONPS_INVALID_ARGUMENT;
  }
  absl::StatusOr<std::vector<float>> m = c->client->OwnedMomentum(name, expert);
  if (!m.ok()) return Record(c, m.status());
  if (static_cast<int64_t>(m->size()) != count) {
    return Record(c, absl::InvalidArgumentError(absl::StrCat(
                         "count: ", count, " but the momentum has ", m->size(),
                         " floats")));
  }
  std::copy(m->begin(), m->end(), out);
  return Record(c, absl::OkStatus());
}

int muonps_client_set_momentum(muonps_client* c, const char* name,
                               int64_t expert, const float* values,
                               int64_t count) {
  if (c == nullptr || name == nullptr || values == nullptr || count < 0) {
    return MUONPS_INVALID_ARGUMENT;
  }
  return Record(c,
                c->client->RestoreMomentum(
                    name, expert, std::vector<float>(values, values + count)));
}

int muonps_client_get_adamw(muonps_client* c, const char* name, float* exp_avg,
                            float* exp_avg_sq, int64_t elements,
                            int64_t* steps) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<std::pair<const float*, const float*>> state =
      c->client->AdamWState(name);
  if (!state.ok()) return Record(c, state.status());
  absl::StatusOr<muonps::TensorBuffers> b = c->client->Buffers(name);
  if (!b.ok()) return Record(c, b.status());
  if (b->elements != elements) {
    return Record(c, absl::InvalidArgumentError(
                         absl::StrCat("elements: ", elements, " but \"", name,
                                      "\" has ", b->elements)));
  }
  if (exp_avg != nullptr) {
    std::copy(state->first, state->first + elements, exp_avg);
  }
  if (exp_avg_sq != nullptr) {
    std::copy(state->second, state->second + elements, exp_avg_sq);
  }
  if (steps != nullptr) *steps = c->client->adamw_steps();
  return Record(c, absl::OkStatus());
}

int muonps_client_set_adamw(muonps_client* c, const char* name,
                            const float* exp_avg, const float* exp_avg_sq,
                            int64_t elements, int64_t steps) {
  if (c == nullptr || name == nullptr || exp_avg == nullptr ||
      exp_avg_sq == nullptr || elements < 0 || steps < 0) {
    return MUONPS_INVALID_ARGUMENT;
  }
  const absl::Status status = c->client->RestoreAdamW(
      name, std::vector<float>(exp_avg, exp_avg + elements),
      std::vector<float>(exp_avg_sq, exp_avg_sq + elements));
  if (status.ok()) c->client->set_adamw_steps(steps);
  return Record(c, status);
}

int muonps_client_set_last_adamw_step(muonps_client* c, int64_t step_id) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  if (step_id < -1) {
    return Record(c, absl::InvalidArgumentError(
                         absl::StrCat("step_id: ", step_id, " < -1")));
  }
  c->client->set_last_adamw_step(step_id);
  return Record(c, absl::OkStatus());
}

int muonps_client_resume_after(muonps_client* c, int64_t step_id) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Record(c, c->client->ResumeAfter(step_id));
}

int muonps_client_checkpoint(muonps_client* c, int64_t* last_step) {
  if (c == nullptr || last_step == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<int64_t> last = c->client->RequestCheckpoint();
  if (!last.ok()) return Record(c, last.status());
  *last_step = *last;
  return Record(c, absl::OkStatus());
}

int muonps_client_last_checkpoint_step(muonps_client* c, int64_t* step) {
  if (c == nullptr || step == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<int64_t> last = c->client->LastCheckpointStep();
  if (!last.ok()) return Record(c, last.status());
  *step = *last;
  return Record(c, absl::OkStatus());
}

int muonps_client_restore_checkpoint(muonps_client* c, const char* dir,
                                     int64_t step, int64_t* restored) {
  if (c == nullptr || dir == nullptr || restored == nullptr) {
    return MUONPS_INVALID_ARGUMENT;
  }
  absl::StatusOr<int64_t> n = c->client->RestoreCheckpoint(dir, step);
  if (!n.ok()) return Record(c, n.status());
  *restored = *n;
  return Record(c, absl::OkStatus());
}

}  // extern "C"
