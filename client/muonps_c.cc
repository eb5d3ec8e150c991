#include "client/muonps_c.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/dtype.h"

struct muonps_client {
  std::unique_ptr<muonps::Client> client;
  std::string last_error;
  // muonps_client_set_group's groups, by index.
  std::vector<std::vector<std::string>> groups;
};

namespace {

// Per-thread: the message of the last failed muonps_client_create.
thread_local std::string create_error;

std::string Quote(const char* name) { return absl::StrCat("\"", name, "\""); }

int Record(muonps_client* c, const absl::Status& status) {
  c->last_error = status.ok() ? "" : std::string(status.message());
  return static_cast<int>(status.code());
}

muonps::scheduler::Layout ToLayout(int layout) {
  switch (layout) {
    case MUONPS_LAYOUT_UNREDUCED:
      return muonps::scheduler::Layout::kUnreduced;
    case MUONPS_LAYOUT_ROW_SHARDED:
      return muonps::scheduler::Layout::kRowSharded;
    default:
      return muonps::scheduler::Layout::kReplicated;
  }
}

bool ValidLayout(int layout) {
  return layout == MUONPS_LAYOUT_REPLICATED ||
         layout == MUONPS_LAYOUT_UNREDUCED ||
         layout == MUONPS_LAYOUT_ROW_SHARDED;
}

constexpr int kMaxGroups = 64;

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
  }
  return Record(c, absl::OkStatus());
}

}  // namespace

extern "C" {

#define MUONPS_C_STRINGIFY_(x) #x
#define MUONPS_C_STRINGIFY(x) MUONPS_C_STRINGIFY_(x)

const char* muonps_version(void) {
  return "muonps 0.2.0 (C ABI " MUONPS_C_STRINGIFY(MUONPS_C_ABI_VERSION) ")";
}
int muonps_abi_version(void) { return MUONPS_C_ABI_VERSION; }

int muonps_client_create(const char* coordinator, const char* job,
                         const char* worker_socket, int trainer_rank,
                         int trainer_count, double timeout_seconds,
                         muonps_client** out) {
  return muonps_client_create_on(coordinator, job, worker_socket, trainer_rank,
                                 trainer_count, timeout_seconds, "cpu", out);
}

int muonps_client_create_on(const char* coordinator, const char* job,
                            const char* worker_socket, int trainer_rank,
                            int trainer_count, double timeout_seconds,
                            const char* device, muonps_client** out) {
  if (out == nullptr) return MUONPS_INVALID_ARGUMENT;
  *out = nullptr;
  if (coordinator == nullptr || job == nullptr || worker_socket == nullptr) {
    create_error = "coordinator, job and worker_socket must not be NULL";
    return MUONPS_INVALID_ARGUMENT;
  }
  muonps::ClientOptions options;
  options.coordinator = coordinator;
  options.job = job;
  options.worker_socket = worker_socket;
  options.trainer_rank = trainer_rank;
  options.trainer_count = trainer_count;
  if (timeout_seconds > 0) options.timeout = absl::Seconds(timeout_seconds);
  absl::StatusOr<muonps::Device> parsed =
      muonps::ParseDevice(device == nullptr ? "cpu" : device);
  if (!parsed.ok()) {
    create_error = std::string(parsed.status().message());
    return static_cast<int>(parsed.status().code());
  }
  options.device = *parsed;
  absl::StatusOr<std::unique_ptr<muonps::Client>> client =
      muonps::Client::Create(options);
  if (!client.ok()) {
    create_error = std::string(client.status().message());
    return static_cast<int>(client.status().code());
  }
  *out = new muonps_client{*std::move(client), "", {}};
  return MUONPS_OK;
}

const char* muonps_last_create_error(void) { return create_error.c_str(); }

void muonps_client_destroy(muonps_client* client) { delete client; }

const char* muonps_client_last_error(const muonps_client* client) {
  return client == nullptr ? "client is NULL" : client->last_error.c_str();
}

int muonps_client_add_matrix(muonps_client* c, const char* name, int64_t rows,
                             int64_t cols, int64_t experts, int layout,
                             int layer) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  if (!ValidLayout(layout)) {
    return Record(c, absl::InvalidArgumentError("layout: unknown value"));
  }
  muonps::MatrixOptions options;
  options.layout = ToLayout(layout);
  options.layer = layer;
  options.experts = experts;
  return Record(c, c->client->AddMatrix(name, rows, cols, options));
}

int muonps_client_add_tensor(muonps_client* c, const char* name,
                             int64_t elements, int layout) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  if (!ValidLayout(layout)) {
    return Record(c, absl::InvalidArgumentError("layout: unknown value"));
  }
  return Record(c, c->client->AddTensor(name, elements, ToLayout(layout)));
}

int muonps_client_start(muonps_client* c, const muonps_muon_hyper* muon,
                        const muonps_adamw_hyper* adamw) {
  if (c == nullptr || muon == nullptr || adamw == nullptr) {
    return MUONPS_INVALID_ARGUMENT;
  }
  muonps::kernels::MuonHyperparameters m;
  m.lr = muon->lr;
  m.weight_decay = muon->weight_decay;
  m.momentum = muon->momentum;
  m.nesterov = muon->nesterov != 0;
  m.ns.steps = muon->ns_steps > 0 ? muon->ns_steps : 5;
  m.lr_adjustment = muon->adjust_lr_fn == MUONPS_ADJUST_LR_MATCH_RMS_ADAMW
                        ? muonps::kernels::LrAdjustment::kMatchRmsAdamW
                        : muonps::kernels::LrAdjustment::kOriginal;
  m.ns.polar_express = muon->polar_express != 0;
  if (muon->ns_eps != 0) m.ns.eps = muon->ns_eps;
  const double* abc = muon->ns_coefficients;
  if (abc[0] != 0 || abc[1] != 0 || abc[2] != 0) {
    m.ns.coefficients = {abc[0], abc[1], abc[2]};
  }
  std::optional<muonps::kernels::NsAlgorithm> algorithm;
  switch (muon->ns_algorithm) {
    case MUONPS_NS_AUTO:
      break;
    case MUONPS_NS_NS5:
      algorithm = muonps::kernels::NsAlgorithm::kNs5;
      break;
    case MUONPS_NS_GRAM:
      algorithm = muonps::kernels::NsAlgorithm::kGram;
      break;
    default:
      return Record(c,
                    absl::InvalidArgumentError(absl::StrCat(
                        "ns_algorithm: unknown value ", muon->ns_algorithm)));
  }
  muonps::kernels::AdamWHyperparameters a;
  a.lr = adamw->lr;
  a.beta1 = adamw->beta1;
  a.beta2 = adamw->beta2;
  a.eps = adamw->eps;
  a.weight_decay = adamw->weight_decay;
  return Record(c, c->client->Start(m, a, algorithm));
}

int muonps_client_buffers(const muonps_client* c, const char* name,
                          float** param, float** grad, int64_t* elements,
                          int64_t* row_begin, int64_t* row_end) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<muonps::TensorBuffers> b = c->client->Buffers(name);
  if (!b.ok()) {
    const_cast<muonps_client*>(c)->last_error =
        std::string(b.status().message());
    return static_cast<int>(b.status().code());
  }
  if (param != nullptr) *param = b->param;
  if (grad != nullptr) *grad = b->grad;
  if (elements != nullptr) *elements = b->elements;
  if (row_begin != nullptr) *row_begin = b->row_begin;
  if (row_end != nullptr) *row_end = b->row_end;
  return MUONPS_OK;
}

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

int muonps_client_lend_cuda(muonps_client* c, const char* name,
                            uint64_t grad_ptr, uint64_t param_ptr,
                            const char* dtype) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<muonps::DType> parsed =
      muonps::ParseDType(dtype == nullptr ? "fp32" : dtype);
  if (!parsed.ok()) return Record(c, parsed.status());
  return Record(
      c, c->client->LendCuda(name, reinterpret_cast<void*>(grad_ptr),
                             reinterpret_cast<void*>(param_ptr), *parsed));
}

int muonps_client_expect_dedicated_workers(muonps_client* c, int count) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Record(c, c->client->ExpectDedicatedWorkers(count));
}

int muonps_client_allow_momentum_reset(muonps_client* c, int allow) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Record(c, c->client->AllowMomentumReset(allow != 0));
}

int muonps_client_set_checkpointing(muonps_client* c, const char* dir,
                                    int64_t every) {
  if (c == nullptr || dir == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Record(c, c->client->SetCheckpointing(dir, every));
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

int muonps_client_set_group(muonps_client* c, int group,
                            const char* const* matrices, int count) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  if (group < 0 || group >= kMaxGroups) {
    return Record(c,
                  absl::InvalidArgumentError(absl::StrCat(
                      "group: ", group, " is not in [0, ", kMaxGroups, ")")));
  }
  if (count < 0 || (count > 0 && matrices == nullptr)) {
    return Record(c, absl::InvalidArgumentError("matrices: NULL or count < 0"));
  }
  if (static_cast<int>(c->groups.size()) <= group) c->groups.resize(group + 1);
  c->groups[group].clear();
  for (int i = 0; i < count; ++i) {
    if (matrices[i] == nullptr) {
      return Record(c, absl::InvalidArgumentError(
                           absl::StrCat("matrices[", i, "]: NULL")));
    }
    c->groups[group].push_back(matrices[i]);
  }
  return Record(c, absl::OkStatus());
}

int muonps_client_step_with(muonps_client* c, int64_t step_id,
                            const muonps_step_options* o,
                            muonps_step_result* result) {
  if (c == nullptr || o == nullptr) return MUONPS_INVALID_ARGUMENT;
  muonps::StepOptions options;
  options.lr = o->lr;
  options.weight_decay = o->weight_decay;
  options.adamw_lr = o->adamw_lr;
  options.stream = reinterpret_cast<muonps::Stream>(o->stream);
  options.async = o->async != 0;
  if (o->group_count < 0 ||
      o->group_count > static_cast<int>(c->groups.size()) ||
      (o->group_count > 0 &&
       (o->group_lr == nullptr || o->group_weight_decay == nullptr))) {
    return Record(c, absl::InvalidArgumentError(
                         absl::StrCat("group_count: ", o->group_count, " with ",
                                      c->groups.size(), " groups set")));
  }
  for (int g = 0; g < o->group_count; ++g) {
    if (c->groups[g].empty()) continue;
    options.groups.push_back(
        {c->groups[g], o->group_lr[g], o->group_weight_decay[g]});
  }
  return Finish(c, c->client->Step(step_id, options), result);
}

int muonps_client_wait(muonps_client* c, muonps_step_result* result) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Finish(c, c->client->Wait(), result);
}

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
                         absl::StrCat("elements: ", elements, " but ",
                                      Quote(name), " has ", b->elements)));
  }
  if (exp_avg != nullptr)
    std::copy(state->first, state->first + elements, exp_avg);
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

}  // extern "C"
