#include "tests/client_options.h"

#include "absl/strings/str_cat.h"

namespace muonps {
namespace testing {

TensorLayout ClientLayout(scheduler::Layout layout) {
  switch (layout) {
    case scheduler::Layout::kUnreduced:
      return TensorLayout::kUnreduced;
    case scheduler::Layout::kRowSharded:
      return TensorLayout::kRowSharded;
    case scheduler::Layout::kReplicated:
      break;
  }
  return TensorLayout::kReplicated;
}

BufferDType ClientDType(DType dtype) {
  return dtype == DType::kBFloat16 ? BufferDType::kBFloat16
                                   : BufferDType::kFloat32;
}

MuonOptions ClientMuon(const kernels::MuonHyperparameters& h) {
  MuonOptions out;
  out.lr = h.lr;
  out.weight_decay = h.weight_decay;
  out.momentum = h.momentum;
  out.nesterov = h.nesterov;
  out.adjust_lr = h.lr_adjustment == kernels::LrAdjustment::kMatchRmsAdamW
                      ? AdjustLr::kMatchRmsAdamW
                      : AdjustLr::kOriginal;
  out.ns_steps = h.ns.steps;
  out.ns_coefficients = {h.ns.coefficients.a, h.ns.coefficients.b,
                         h.ns.coefficients.c};
  out.polar_express = h.ns.polar_express;
  out.ns_eps = h.ns.eps;
  return out;
}

AdamWOptions ClientAdamW(const kernels::AdamWHyperparameters& h) {
  return {.lr = h.lr,
          .beta1 = h.beta1,
          .beta2 = h.beta2,
          .eps = h.eps,
          .weight_decay = h.weight_decay};
}

absl::StatusOr<std::map<std::string, NsAlgorithm>> NsAlgorithmsOf(
    const absl::StatusOr<std::map<std::string, NewtonSchulz>>& algorithms) {
  if (!algorithms.ok()) return algorithms.status();
  std::map<std::string, NsAlgorithm> out;
  for (const auto& [name, algorithm] : *algorithms) {
    switch (algorithm) {
      case NewtonSchulz::kNs5:
        out[name] = NsAlgorithm::kNs5;
        break;
      case NewtonSchulz::kGram:
        out[name] = NsAlgorithm::kGram;
        break;
      case NewtonSchulz::kAuto:
        return absl::InternalError(
            absl::StrCat("matrix ", name, ": the plan picked no NS algorithm"));
    }
  }
  return out;
}

}  // namespace testing
}  // namespace muonps
