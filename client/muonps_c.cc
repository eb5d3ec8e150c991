// The C ABI's handle, registration and start calls (muonps_c.h);
// muonps_c_step.cc has the step, checkpoint and optimizer-state calls.
#include "client/muonps_c.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/muonps_c_internal.h"
#include "common/dtype.h"

namespace {

using muonps::client_internal::Record;

// Per-thread: the message of the last failed muonps_client_create.
thread_local std::string create_error;

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

}  // extern "C"
