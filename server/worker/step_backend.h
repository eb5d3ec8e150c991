// StepBackend: what a worker's steps compute with, kernels and device ops
// on one device and the way to open a trainer's lent buffers there. The
// worker's factory (server/worker/main.cc) picks one: CpuStepBackend
// (OpenBLAS on host memory, shared-memory buffers) or CudaStepBackend
// (cuda_step_backend.h). Plain values; thread-compatible.
#ifndef MUONPS_SERVER_WORKER_STEP_BACKEND_H_
#define MUONPS_SERVER_WORKER_STEP_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "kernels/device_ops.h"
#include "kernels/muon_kernels.h"
#include "server/worker/staging_windows.h"
#include "server/worker/trainer_buffers.h"

namespace muonps {
namespace worker {

// Where a worker's updates go into the trainer's parameters (--apply_early):
// as the plan says (its clock chose: Plan.apply_at_commit), before the
// commit wherever that is allowed, or always at the commit.
enum class EarlyApplyPolicy { kAsPlanned, kAlways, kNever };
// The flag's words: "plan", "always", "never"; INVALID_ARGUMENT naming the
// flag for another.
absl::StatusOr<EarlyApplyPolicy> EarlyApplyPolicyFromName(
    const std::string& name);

// A step passes its streams on every call: transfers on ops->stream(),
// momentum and Newton-Schulz on ops->compute_stream().
struct StepBackend {
  std::unique_ptr<kernels::MuonKernels> kernels;
  std::unique_ptr<kernels::DeviceOps> ops;
  TrainerBuffersOpener open_buffers;
  // Lends the trainer's staged updates to the workers of this host, so
  // that owners write updates into them (staging_windows.h); null: every
  // update travels by the transport.
  std::shared_ptr<WindowLender> windows;
  // A step whose transfers do not progress for this long fails.
  absl::Duration timeout = absl::Seconds(10);
  // Whether updates may go into the trainer's parameters before the
  // commit, where StepContext::apply_early allows (--apply_early).
  EarlyApplyPolicy apply_early = EarlyApplyPolicy::kAsPlanned;
};

// The CPU backend: CpuKernels and CpuDeviceOps, shared-memory buffers;
// updates rounded to `update_dtype` (CpuKernelOptions).
StepBackend CpuStepBackend(absl::Duration timeout,
                           DType update_dtype = DType::kFloat32);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_BACKEND_H_
