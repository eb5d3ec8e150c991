// The commit of a step (step_run.h describes the whole protocol): applying
// a staged step to the trainer's parameters and the owned momentum, dropping
// one, and the two phases that decide between them on every rank at once
// (votes to rank 0, its decision back, then confirmations).
//
// The commit point: CommitStaged is the one place where a step changes
// anything that outlives it (the trainer's parameters and AdamW gradients,
// the momentum, StepLedger::last). A checkpoint of the momentum belongs
// right after it. Used by the step's thread under the engine's lock.
#ifndef MUONPS_SERVER_WORKER_STEP_COMMIT_H_
#define MUONPS_SERVER_WORKER_STEP_COMMIT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/device_ops.h"
#include "server/worker/step_control.h"
#include "server/worker/step_state.h"

namespace muonps {
namespace worker {

// Points of a step where the chaos tests stop a worker (StepHook).
enum class StepPoint {
  kExchange,   // the round opens: nothing sent yet
  kTransfer,   // the first bucket's gradients moved
  kPrepared,   // staged and voted (rank 0: every vote received, undecided)
  kCommitted,  // committed here, not confirmed
  // Decided before its updates landed (EarlyApply::kDecided): the
  // step record says applying, and no update is in the parameters yet.
  kDecided,
};
const char* StepPointName(StepPoint point);
// Called at each point with the step id (the request's at kExchange) and
// this worker's rank in the plan; may block (a test stops the process
// there). Null in production.
using StepHook =
    std::function<void(StepPoint point, int64_t step_id, int rank)>;
// True once the trainer's Step call was cancelled or passed its deadline.
using StepCancelled = std::function<bool()>;

// Applies `ledger`'s staged step: the AdamW means, then the parameters'
// updates in the order the trainer bound its matrices (not those applied
// as they landed: ParamApply::applied; it orders its writes after the
// compute stream's StagedStep::applied_mark), into the trainer's
// lent memory (`trainer` may be null: a worker with no trainer, or one
// whose trainer is gone), the new momentum swapped in (plan.momentum's
// CommitStaged); then sets ledger.last and clears the staging. With
// `release` >= 0 (the step the trainer asked for, committed by its own
// round), the parameters' progress word follows the writes
// (SignalParameters: 0 after the means, then every few MiB of whole
// matrices), and the trainer's stream is released (SignalTrainer) in
// stream order right after them, before anything waits on the host. Waits
// for the stream. An error means the device failed mid-way.
absl::Status CommitStaged(StepLedger& ledger, PlanState& plan,
                          const AttachedTrainer* trainer,
                          kernels::DeviceOps& ops, int64_t release = -1);
// Writes `applies` (of `trainer`'s staged updates) into its parameters, in
// `stream` order, and nothing else (no progress word).
absl::Status ApplyUpdates(absl::Span<const ParamApply> applies,
                          const AttachedTrainer& trainer,
                          kernels::DeviceOps& ops, Stream stream);
// Copies the parameter ranges `applies` will write into `trainer.kept`
// (which must be allocated), in `stream` order.
absl::Status KeepParameters(absl::Span<const ParamApply> applies,
                            const AttachedTrainer& trainer,
                            kernels::DeviceOps& ops, Stream stream);
// Copies them back from `trainer.kept`, in `stream` order: the parameters
// as KeepParameters found them.
absl::Status RestoreParameters(absl::Span<const ParamApply> applies,
                               const AttachedTrainer& trainer,
                               kernels::DeviceOps& ops, Stream stream);
// Forgets the staged step (momentum and parameters stay as they were).
void DropStaged(StepLedger& ledger, PlanState& plan);
// A retry of step `step_id` answered already_applied: when the trainer's
// staging still holds that step's AdamW means (StepLedger::means_step),
// writes them into the lent gradients again (the client steps AdamW on
// them). Waits for the stream.
absl::Status RedeliverMeans(const StepLedger& ledger, int64_t step_id,
                            const AttachedTrainer& trainer,
                            kernels::DeviceOps& ops);

// How the two phases ended on this rank.
struct CommitOutcome {
  // OK: committed everywhere (confirmed). Otherwise the error for the
  // trainer, saying whether this rank applied the step.
  absl::Status status;
  // The step was applied here (confirmed or not).
  bool committed = false;
  // This rank heard (or, as rank 0, made) the decision to commit it, so it
  // applied the step or failed part-way: what it applied early stays.
  bool decided = false;
  // The transport is still in step with the peers (an abort every rank
  // heard); false: it must be rebuilt.
  bool transport_ok = false;
};

// Runs the two phases of step `step_id` once this rank's part is staged
// (`ready` OK) or failed locally (`ready` says why; the rank votes no if it
// still can). `worker_ids` by rank name the voters in messages.
CommitOutcome RunCommitPhases(int64_t step_id, const absl::Status& ready,
                              ControlChannel& control, int rank, int size,
                              const std::vector<std::string>& worker_ids,
                              StepLedger& ledger, PlanState& plan,
                              const AttachedTrainer* trainer,
                              kernels::DeviceOps& ops,
                              const StepCancelled& cancelled,
                              const StepHook& hook);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_COMMIT_H_
