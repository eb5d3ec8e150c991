// The peer of bench/step_cpu: the same matrices stepped in this process,
// one after another, with kernels::CpuKernels::MuonStep (momentum,
// Newton-Schulz with the algorithm the muonps plan chose for the matrix,
// weight decay and the scaled update) on the trainers' mean gradient, as a
// single process without muonps would. Thread-compatible; not copyable.
#ifndef MUONPS_BENCH_STEP_CPU_ONE_PROCESS_STEP_H_
#define MUONPS_BENCH_STEP_CPU_ONE_PROCESS_STEP_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/step_cpu/step_model.h"
#include "kernels/cpu/cpu_kernels.h"
#include "newton_schulz/options.h"

namespace muonps {
namespace bench {

class OneProcessStepper {
 public:
  // Fills the mean over `ranks` ranks of FillGradient's gradients (the fp32
  // sum times 1 / ranks, as the workers form it), zero momentum and the
  // initial parameters. `openblas_threads` 0 keeps OpenBLAS's default
  // (every core); the setting is process-wide.
  OneProcessStepper(std::vector<StepMatrix> matrices, int ranks,
                    int openblas_threads);
  OneProcessStepper(const OneProcessStepper&) = delete;
  OneProcessStepper& operator=(const OneProcessStepper&) = delete;

  // NS algorithm by matrix name (kNs5 for the others).
  void set_algorithms(std::map<std::string, NsAlgorithm> algorithms) {
    algorithms_ = std::move(algorithms);
  }

  // One step of every matrix; returns its wall seconds. Errors are
  // MuonStep's, naming the matrix.
  absl::StatusOr<double> Step();

  // The parameters, matrix after matrix.
  std::vector<float> Parameters() const;

 private:
  const std::vector<StepMatrix> matrices_;
  std::vector<std::vector<float>> grads_, momenta_, params_;
  std::map<std::string, NsAlgorithm> algorithms_;
  kernels::CpuKernels kernels_;
};

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_CPU_ONE_PROCESS_STEP_H_
