// The kernel backend golden_replay runs on and the tolerances it is held
// to, chosen from its --backend and --precision flags: the CPU backend
// (fp32 only) or the CUDA backend through host staging (fp32, bf16 or fp16
// GEMM inputs). Pure factory functions; thread-safe.
#ifndef MUONPS_TOOLS_GOLDEN_REPLAY_REPLAY_BACKEND_H_
#define MUONPS_TOOLS_GOLDEN_REPLAY_REPLAY_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/muon_kernels.h"
#include "tools/golden_replay/golden_replay.h"

namespace muonps {
namespace golden {

struct BackendFlags {
  std::string backend = "cpu";     // cpu | cuda
  std::string precision = "fp32";  // fp32 | bf16 | fp16 (cuda only for 16)
  int threads = 0;                 // OpenBLAS threads (cpu)
  int device = 0;                  // CUDA device (cuda)
};

// The backend for `flags`. INVALID_ARGUMENT naming `backend` or `precision`
// for an unknown name or a precision the backend lacks; the CUDA backend's
// own error (UNAVAILABLE naming `device` on a machine without a usable GPU)
// when it cannot start.
absl::StatusOr<std::unique_ptr<kernels::MuonKernels>> MakeReplayBackend(
    const BackendFlags& flags);

// The CPU tolerances for fp32; for bf16 and fp16 Newton-Schulz inputs, Muon
// params within 1e-2 relative (the bound after 4 steps) and, for
// bf16, a lone NS output within 8e-2 (NS5) or 0.15 (Gram) of torch's own
// bf16 one (both round); momentum and AdamW unchanged (they do not depend
// on the GEMM precision). INVALID_ARGUMENT naming `precision` for an
// unknown name.
absl::StatusOr<Tolerances> TolerancesFor(absl::string_view precision,
                                         NsAlgorithm algorithm);

}  // namespace golden
}  // namespace muonps

#endif  // MUONPS_TOOLS_GOLDEN_REPLAY_REPLAY_BACKEND_H_
