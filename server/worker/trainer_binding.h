// A trainer's bindings (AttachRequest) checked against the job and mapped
// from its lent buffers into what a step uses (AttachedTrainer): every job
// matrix bound once with the right element count (its rows of a
// row-sharded one), every other tensor (stepped with AdamW by the client)
// named once with 1..kMaxLentElements elements, replicated or unreduced;
// buffers inside the lent memory. Pure functions of their arguments (the
// mapping is the TrainerBuffers'); thread-compatible.
#ifndef MUONPS_SERVER_WORKER_TRAINER_BINDING_H_
#define MUONPS_SERVER_WORKER_TRAINER_BINDING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/plan_types.h"
#include "server/worker/attach_request.h"
#include "server/worker/step_state.h"
#include "server/worker/trainer_buffers.h"

namespace muonps {
namespace worker {

// The most elements a lent tensor may have (client.h's
// kMaxTensorElements): sizes and offsets computed from it never overflow.
inline constexpr int64_t kMaxLentElements = int64_t{1} << 40;

// The trainer's bindings checked against the job's `matrices` and mapped
// from `buffers`, with their parameter groups and the digest the round's
// agreement compares; a row-sharded matrix's rows are the trainer's of the
// job's `replicas` (ReplicaRowRange). INVALID_ARGUMENT naming the tensor (a bad
// binding, one outside the lent memory); FAILED_PRECONDITION naming a job
// matrix left unbound. The result is the caller's (its `buffers` still unset).
absl::StatusOr<AttachedTrainer> BindTrainer(
    const AttachRequest& request,
    const std::vector<scheduler::MatrixSpec>& matrices, int replicas,
    TrainerBuffers& buffers);

// Whether `a` and `b` are the same matrices (names, shapes, experts,
// layouts, how a stack is sharded) in the same order: bindings checked against
// one hold for the other.
bool SameMatrices(const std::vector<scheduler::MatrixSpec>& a,
                  const std::vector<scheduler::MatrixSpec>& b);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_TRAINER_BINDING_H_
