// The finite check of a step's gradients: every gradient a step reads is
// checked before the step can change anything. Each worker checks what it
// reads from its own trainer, once the trainer's gradients are all written
// (after the stage, before its vote: a non-finite gradient votes no, so
// nothing is applied anywhere). Used by the step's thread.
#ifndef MUONPS_SERVER_WORKER_GRADIENT_CHECK_H_
#define MUONPS_SERVER_WORKER_GRADIENT_CHECK_H_

#include "absl/status/status.h"
#include "kernels/device_ops.h"
#include "server/worker/step_state.h"

namespace muonps {
namespace worker {

// OK when every gradient this worker reads from `trainer` in a step of
// `plan` is finite: its job matrices (a replicated one only where this
// worker owns it, or, for an owner with no trainer, on trainer 0's worker,
// which sends it) and every AdamW tensor. Runs on `stream` after the work
// enqueued there and waits for it. INVALID_ARGUMENT naming the tensor and
// the element ("grad of \"w\": element 3 is NaN"); the device's error when
// it fails.
absl::Status CheckGradientsFinite(const PlanState& plan,
                                  const AttachedTrainer& trainer,
                                  kernels::DeviceOps& ops, Stream stream);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_GRADIENT_CHECK_H_
