// A round's repair (step_protocol.h's RoundKind::kRepair): the trainer of
// one rank misses the job's last committed step, because the worker before
// this one on that rank stopped before applying it or part-way (its
// trainer's step record says which), or holds part of a later step that
// nobody committed (that worker applied updates before the votes and was
// killed before it could put them back). Another rank whose trainer holds
// the committed step sends that trainer's parameter of every job matrix,
// whole, and, where the target's trainer retries the committed step, the
// step's AdamW means from its staging; the target writes them into its
// trainer's lent memory, between the step record's applying and applied
// words, and records the step as committed here. Exact: every trainer's
// replica of a matrix gets the same updates from the same kernels, so the
// replicas are equal bit for bit.
//
// Streams: the transfers and the record's writes on the ops' stream();
// returns once they are done (a lost peer fails it within the timeout).
// Used by the step's thread under the engine's lock.
#ifndef MUONPS_SERVER_WORKER_PARAM_REPAIR_H_
#define MUONPS_SERVER_WORKER_PARAM_REPAIR_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/device_ops.h"
#include "server/worker/step_protocol.h"
#include "server/worker/step_state.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// Runs `decision`'s repair on rank `plan.rank`: sends as its source,
// receives as its target, nothing elsewhere. `trainer` is null on a rank
// with no trainer (never a source or a target). Errors are the
// transport's or the device's: the ranks are out of step, and a target
// whose writing stopped part-way says so in its step record.
absl::Status RepairParameters(const RoundDecision& decision,
                              const PlanState& plan,
                              const AttachedTrainer* trainer,
                              transport::Transport& transport,
                              kernels::DeviceOps& ops, StepLedger& ledger,
                              absl::Duration timeout);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_PARAM_REPAIR_H_
