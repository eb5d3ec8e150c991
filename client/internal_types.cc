#include "client/internal_types.h"

namespace muonps {
namespace client_internal {

scheduler::Layout ToLayout(TensorLayout layout) {
  switch (layout) {
    case TensorLayout::kUnreduced:
      return scheduler::Layout::kUnreduced;
    case TensorLayout::kRowSharded:
      return scheduler::Layout::kRowSharded;
    case TensorLayout::kReplicated:
      break;
  }
  return scheduler::Layout::kReplicated;
}

DType ToDType(BufferDType dtype) {
  return dtype == BufferDType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
}

BufferDType ToBufferDType(DType dtype) {
  return dtype == DType::kBFloat16 ? BufferDType::kBFloat16
                                   : BufferDType::kFloat32;
}

kernels::LrAdjustment ToLrAdjustment(AdjustLr adjust) {
  return adjust == AdjustLr::kMatchRmsAdamW
             ? kernels::LrAdjustment::kMatchRmsAdamW
             : kernels::LrAdjustment::kOriginal;
}

std::optional<NsAlgorithm> ToNsAlgorithm(NewtonSchulz algorithm) {
  switch (algorithm) {
    case NewtonSchulz::kNs5:
      return NsAlgorithm::kNs5;
    case NewtonSchulz::kGram:
      return NsAlgorithm::kGram;
    case NewtonSchulz::kAuto:
      break;
  }
  return std::nullopt;
}

NewtonSchulz FromNsAlgorithm(NsAlgorithm algorithm) {
  return algorithm == NsAlgorithm::kGram ? NewtonSchulz::kGram
                                         : NewtonSchulz::kNs5;
}

kernels::MuonHyperparameters ToMuonHyperparameters(const MuonOptions& muon) {
  kernels::MuonHyperparameters h;
  h.lr = muon.lr;
  h.weight_decay = muon.weight_decay;
  h.momentum = muon.momentum;
  h.nesterov = muon.nesterov;
  h.lr_adjustment = ToLrAdjustment(muon.adjust_lr);
  h.ns.steps = muon.ns_steps;
  h.ns.coefficients = {muon.ns_coefficients[0], muon.ns_coefficients[1],
                       muon.ns_coefficients[2]};
  h.ns.polar_express = muon.polar_express;
  h.ns.eps = muon.ns_eps;
  return h;
}

kernels::AdamWHyperparameters ToAdamWHyperparameters(const AdamWOptions& a) {
  kernels::AdamWHyperparameters h;
  h.lr = a.lr;
  h.beta1 = a.beta1;
  h.beta2 = a.beta2;
  h.eps = a.eps;
  h.weight_decay = a.weight_decay;
  return h;
}

SecurityConfig ToSecurityConfig(const ClientSecurity& security) {
  SecurityConfig config;
  config.token_file = security.token_file;
  config.tls_ca_file = security.tls_ca_file;
  config.tls_cert_file = security.tls_cert_file;
  config.tls_key_file = security.tls_key_file;
  return config;
}

}  // namespace client_internal
}  // namespace muonps
