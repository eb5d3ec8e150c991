// The C ABI's calls before and at start (muonps_c.h): declaring tensors,
// parameter groups, lending CUDA buffers, the job's options, start, and
// the buffers start lays out.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/muonps_c.h"
#include "client/muonps_c_internal.h"

namespace {

using muonps::client_internal::Record;

// MUONPS_LAYOUT_* as the client's layout; INVALID_ARGUMENT naming `layout`
// for anything else.
absl::StatusOr<muonps::TensorLayout> ToLayout(int layout) {
  switch (layout) {
    case MUONPS_LAYOUT_REPLICATED:
      return muonps::TensorLayout::kReplicated;
    case MUONPS_LAYOUT_UNREDUCED:
      return muonps::TensorLayout::kUnreduced;
    case MUONPS_LAYOUT_ROW_SHARDED:
    case MUONPS_LAYOUT_ROW_SHARDED_EXPERTS:
      return muonps::TensorLayout::kRowSharded;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("layout: unknown value ", layout));
  }
}

// "fp32" (or NULL, "float32") and "bf16" ("bfloat16"); INVALID_ARGUMENT
// naming `dtype` otherwise.
absl::StatusOr<muonps::BufferDType> ToBufferDType(const char* dtype) {
  const std::string name = dtype == nullptr ? "fp32" : dtype;
  if (name == "fp32" || name == "float32") {
    return muonps::BufferDType::kFloat32;
  }
  if (name == "bf16" || name == "bfloat16") {
    return muonps::BufferDType::kBFloat16;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: \"", name, "\" is not fp32 or bf16"));
}

absl::StatusOr<muonps::MuonOptions> ToMuonOptions(const muonps_muon_hyper& h) {
  muonps::MuonOptions m;
  m.lr = h.lr;
  m.weight_decay = h.weight_decay;
  m.momentum = h.momentum;
  m.nesterov = h.nesterov != 0;
  if (h.ns_steps > 0) m.ns_steps = h.ns_steps;
  m.adjust_lr = h.adjust_lr_fn == MUONPS_ADJUST_LR_MATCH_RMS_ADAMW
                    ? muonps::AdjustLr::kMatchRmsAdamW
                    : muonps::AdjustLr::kOriginal;
  m.polar_express = h.polar_express != 0;
  if (h.ns_eps != 0) m.ns_eps = h.ns_eps;
  const double* abc = h.ns_coefficients;
  if (abc[0] != 0 || abc[1] != 0 || abc[2] != 0) {
    m.ns_coefficients = {abc[0], abc[1], abc[2]};
  }
  switch (h.ns_algorithm) {
    case MUONPS_NS_AUTO:
      m.ns_algorithm = muonps::NewtonSchulz::kAuto;
      break;
    case MUONPS_NS_NS5:
      m.ns_algorithm = muonps::NewtonSchulz::kNs5;
      break;
    case MUONPS_NS_GRAM:
      m.ns_algorithm = muonps::NewtonSchulz::kGram;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("ns_algorithm: unknown value ", h.ns_algorithm));
  }
  return m;
}

}  // namespace

extern "C" {

int muonps_client_add_matrix(muonps_client* c, const char* name, int64_t rows,
                             int64_t cols, int64_t experts, int layout,
                             int layer) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<muonps::TensorLayout> parsed = ToLayout(layout);
  if (!parsed.ok()) return Record(c, parsed.status());
  muonps::MatrixOptions options;
  options.layout = *parsed;
  options.layer = layer;
  options.experts = experts;
  options.shard_experts = layout == MUONPS_LAYOUT_ROW_SHARDED_EXPERTS;
  return Record(c, c->client->AddMatrix(name, rows, cols, options));
}

int muonps_client_add_tensor(muonps_client* c, const char* name,
                             int64_t elements, int layout) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<muonps::TensorLayout> parsed = ToLayout(layout);
  if (!parsed.ok()) return Record(c, parsed.status());
  return Record(c, c->client->AddTensor(name, elements, *parsed));
}

int muonps_client_set_group(muonps_client* c, int group,
                            const char* const* names, int count) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  if (count < 0 || (count > 0 && names == nullptr)) {
    return Record(c, absl::InvalidArgumentError(
                         absl::StrCat("names: NULL or count ", count, " < 0")));
  }
  std::vector<std::string> list;
  list.reserve(count);
  for (int i = 0; i < count; ++i) {
    if (names[i] == nullptr) {
      return Record(
          c, absl::InvalidArgumentError(absl::StrCat("names[", i, "]: NULL")));
    }
    list.push_back(names[i]);
  }
  return Record(c, c->client->SetGroup(group, list));
}

int muonps_client_lend_cuda(muonps_client* c, const char* name,
                            uint64_t grad_ptr, uint64_t param_ptr,
                            const char* dtype) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<muonps::BufferDType> parsed = ToBufferDType(dtype);
  if (!parsed.ok()) return Record(c, parsed.status());
  return Record(
      c, c->client->LendCuda(name, reinterpret_cast<void*>(grad_ptr),
                             reinterpret_cast<void*>(param_ptr), *parsed));
}

int muonps_client_expect_dedicated_workers(muonps_client* c, int count) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Record(c, c->client->ExpectDedicatedWorkers(count));
}

int muonps_client_set_replicas(muonps_client* c, int replicas) {
  if (c == nullptr) return MUONPS_INVALID_ARGUMENT;
  return Record(c, c->client->SetReplicas(replicas));
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

int muonps_client_start(muonps_client* c, const muonps_muon_hyper* muon,
                        const muonps_adamw_hyper* adamw) {
  if (c == nullptr || muon == nullptr || adamw == nullptr) {
    return MUONPS_INVALID_ARGUMENT;
  }
  absl::StatusOr<muonps::MuonOptions> m = ToMuonOptions(*muon);
  if (!m.ok()) return Record(c, m.status());
  muonps::AdamWOptions a;
  a.lr = adamw->lr;
  a.beta1 = adamw->beta1;
  a.beta2 = adamw->beta2;
  a.eps = adamw->eps;
  a.weight_decay = adamw->weight_decay;
  return Record(c, c->client->Start(*m, a));
}

int muonps_client_buffers(const muonps_client* c, const char* name,
                          float** param, float** grad, int64_t* elements,
                          int64_t* row_begin, int64_t* row_end) {
  if (c == nullptr || name == nullptr) return MUONPS_INVALID_ARGUMENT;
  absl::StatusOr<muonps::TensorBuffers> b = c->client->Buffers(name);
  if (!b.ok()) {
    return Record(const_cast<muonps_client*>(c), b.status());
  }
  if (param != nullptr) *param = b->param;
  if (grad != nullptr) *grad = b->grad;
  if (elements != nullptr) *elements = b->elements;
  if (row_begin != nullptr) *row_begin = b->row_begin;
  if (row_end != nullptr) *row_end = b->row_end;
  return MUONPS_OK;
}

}  // extern "C"
