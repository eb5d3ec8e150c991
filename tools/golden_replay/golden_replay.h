// Replays golden PyTorch trajectories through a MuonKernels backend and
// measures how far the backend drifts from them.
//
// A muon or adamw case runs every step from the case's p0 with the golden
// gradients, carrying the backend's own state forward (never resetting to
// the golden values), and compares the parameter (and momentum) after every
// step. Thread-compatible.
#ifndef MUONPS_TOOLS_GOLDEN_REPLAY_GOLDEN_REPLAY_H_
#define MUONPS_TOOLS_GOLDEN_REPLAY_GOLDEN_REPLAY_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/muon_kernels.h"
#include "tools/golden_replay/golden_manifest.h"

namespace muonps {
namespace golden {

// Relative Frobenius tolerances (testdata/torch_optim_golden/README.md: torch
// runs NS in bf16, so fp32 params differ by ~1e-3 after 4 steps and a lone
// NS output by ~2e-2; momentum and AdamW agree to ~1e-7).
struct Tolerances {
  double muon_param = 5e-3;
  double momentum = 1e-6;
  double adamw_param = 1e-6;
  double ns_output = 4e-2;
};

struct CaseResult {
  std::string name;
  CaseKind kind = CaseKind::kMuon;
  // Largest ||ours - golden||_F / ||golden||_F over the steps: of the
  // param (muon, adamw) or of the NS output (newton_schulz).
  double max_rel_err_param = 0;
  // Same for the momentum buffer; muon cases only.
  std::optional<double> max_rel_err_momentum;
  double tolerance = 0;
  std::optional<double> tolerance_momentum;
  bool ok = false;
};

// Replays one case of `manifest` with Newton-Schulz `algorithm`. Errors
// (unreadable files, a kernel rejecting input) come back as a status naming
// the case; a numeric miss is a result with ok = false. `kernels` takes
// host memory (its calls name kHostStream): CpuKernels or
// HostStagingKernels.
absl::StatusOr<CaseResult> ReplayCase(const GoldenManifest& manifest,
                                      const GoldenCase& golden_case,
                                      NsAlgorithm algorithm,
                                      kernels::MuonKernels* kernels,
                                      const Tolerances& tolerances = {});

// One JSON line: case, kind, max_rel_err_param, max_rel_err_momentum,
// tolerance, tolerance_momentum, ok (plus algorithm, backend and the
// Newton-Schulz GEMM input precision).
std::string ResultJson(const CaseResult& result, absl::string_view algorithm,
                       absl::string_view backend,
                       absl::string_view precision = "fp32");

}  // namespace golden
}  // namespace muonps

#endif  // MUONPS_TOOLS_GOLDEN_REPLAY_GOLDEN_REPLAY_H_
