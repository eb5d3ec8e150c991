// GradientCheck: the finite check of a step's gradients, so that every
// gradient a step reads is checked before the step can change anything.
// Each worker checks what it reads from its own trainer: its job matrices
// (a replicated one only where this worker owns it, or, for an owner with
// no trainer, on trainer 0's worker, which sends it: checking it everywhere
// read it N times over) and every AdamW tensor. The stage enqueues each
// check on its transfer stream as that gradient is ready, beside the step's
// other work (StepStaging), and the result is read once, after the stage
// and before the vote: a non-finite gradient votes no, so nothing is
// applied anywhere. Used by the step's thread, for one step.
#ifndef MUONPS_SERVER_WORKER_GRADIENT_CHECK_H_
#define MUONPS_SERVER_WORKER_GRADIENT_CHECK_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/device_ops.h"
#include "server/worker/step_state.h"

namespace muonps {
namespace worker {

class GradientCheck {
 public:
  // Everything must outlive the check; its work goes on `stream`.
  GradientCheck(const PlanState& plan, const AttachedTrainer& trainer,
                kernels::DeviceOps& ops, Stream stream);

  // Clears the check on the stream; first, before any other call.
  absl::Status Prepare();
  // Enqueues the check of matrix `matrix`'s gradient once it is ready, once
  // a step (nothing where this worker does not read it).
  absl::Status Matrix(int32_t matrix);
  // Enqueues the checks of the AdamW tensors' gradients once they are ready.
  absl::Status AdamW();
  // OK when every gradient checked is finite; INVALID_ARGUMENT naming the
  // tensor and the element ("grad of \"w\": element 3 is NaN") otherwise.
  // Waits for the stream; the device's error when it fails.
  absl::Status Result();

 private:
  const PlanState& plan_;
  const AttachedTrainer& trainer_;
  kernels::DeviceOps& ops_;
  const Stream stream_;
  // By job matrix: its span's number, or -1 where this worker does not
  // read it; the AdamW tensors' follow, from adamw_first_.
  std::vector<int64_t> number_;
  int64_t adamw_first_ = 0;
  int64_t count_ = 0;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_GRADIENT_CHECK_H_
