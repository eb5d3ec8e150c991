#include "bench/step_cpu/one_process_step.h"

#include <chrono>

#include "common/status.h"

namespace muonps {
namespace bench {

OneProcessStepper::OneProcessStepper(std::vector<StepMatrix> matrices,
                                     int ranks, int openblas_threads)
    : matrices_(std::move(matrices)),
      grads_(matrices_.size()),
      momenta_(matrices_.size()),
      params_(matrices_.size()),
      kernels_(kernels::CpuKernelOptions{.threads = openblas_threads}) {
  const float inverse = 1.0f / static_cast<float>(ranks);
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const int64_t n = matrices_[i].elements();
    grads_[i].assign(n, 0.0f);
    std::vector<float> rank_grad(n);
    for (int r = 0; r < ranks; ++r) {
      FillGradient(r, static_cast<int>(i), rank_grad.data(), n);
      for (int64_t j = 0; j < n; ++j) grads_[i][j] += rank_grad[j];
    }
    for (float& g : grads_[i]) g *= inverse;
    momenta_[i].assign(n, 0.0f);
    params_[i].resize(n);
    FillInitialParameters(static_cast<int>(i), params_[i].data(), n);
  }
}

absl::StatusOr<double> OneProcessStepper::Step() {
  kernels::MuonHyperparameters hyper = StepMuonHyperparameters();
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < matrices_.size(); ++i) {
    const StepMatrix& m = matrices_[i];
    auto chosen = algorithms_.find(m.name);
    hyper.ns.algorithm =
        chosen == algorithms_.end() ? NsAlgorithm::kNs5 : chosen->second;
    MUONPS_RETURN_IF_ERROR(
        kernels_.MuonStep({.names = {m.name},
                           .grad = {grads_[i].data(), 1, m.rows, m.cols},
                           .momentum = {momenta_[i].data(), 1, m.rows, m.cols},
                           .param = {params_[i].data(), 1, m.rows, m.cols}},
                          hyper, kHostStream));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

std::vector<float> OneProcessStepper::Parameters() const {
  std::vector<float> out;
  for (const std::vector<float>& p : params_) {
    out.insert(out.end(), p.begin(), p.end());
  }
  return out;
}

}  // namespace bench
}  // namespace muonps
