// The model bench/step_cpu steps: the weight matrices of an MLP (no biases,
// so every parameter is a Muon matrix), the Muon hyperparameters, and the
// deterministic initial parameters and per-rank gradients that both the
// muonps run and the one-process peer use. Plain functions of their
// arguments; thread-safe.
#ifndef MUONPS_BENCH_STEP_CPU_STEP_MODEL_H_
#define MUONPS_BENCH_STEP_CPU_STEP_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/muon_kernels.h"

namespace muonps {
namespace bench {

struct StepMatrix {
  std::string name;  // "mlp.<i>.weight"
  int64_t rows = 0;  // out features
  int64_t cols = 0;  // in features
  int32_t layer = 0;

  int64_t elements() const { return rows * cols; }
};

// The weight matrices of an MLP with these widths (input first), layer i
// mapping widths[i] to widths[i + 1]. INVALID_ARGUMENT naming `widths`
// unless there are at least two widths, each >= 1.
absl::StatusOr<std::vector<StepMatrix>> MlpMatrices(
    const std::vector<int64_t>& widths);

// Parses "1024,2560,1024"; INVALID_ARGUMENT naming `widths` otherwise.
absl::StatusOr<std::vector<int64_t>> ParseWidths(absl::string_view text);

int64_t ParameterCount(const std::vector<StepMatrix>& matrices);

// Muon as the workers run it: torch.optim.Muon's defaults (momentum 0.95,
// Nesterov, 5 quintic NS iterations) with lr 0.02, weight decay 0.01 and
// the AdamW-RMS-matching lr adjustment.
kernels::MuonHyperparameters StepMuonHyperparameters();

// Fills `out` (matrix `matrix`'s elements) with the initial parameters,
// identical on every trainer rank: uniform in [-0.02, 0.02).
void FillInitialParameters(int matrix, float* out, int64_t elements);

// Fills `out` with trainer rank `rank`'s gradient of matrix `matrix`:
// uniform in [-0.01, 0.01), different per rank, the same every step.
void FillGradient(int rank, int matrix, float* out, int64_t elements);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_CPU_STEP_MODEL_H_
