// One round of one worker's step, run together with the other workers of
// the plan over a Transport: the data path of "One step's data flow" in
// docs/architecture.md, made
// atomic. StepEngine runs rounds until one answers the trainer. StepRun
// runs a round's parts in order: the agreement (1., 2.: step_agreement.h),
// the stage (3.: step_staging.h) and the commit (4. to 6.: step_commit.h),
// and accounts for it (step_timeline.h).
//
// The protocol (every rank issues the same calls in the same order, so none
// deadlocks; control messages are step_protocol.h's):
//  1. Open. Every rank with a trainer sends rank 0 a header: the step its
//     trainer asks for, its last committed step, the step it holds staged
//     in doubt (and the instance of the rank 0 that ran it), digests of the
//     hyperparameters (lr, weight decay, groups, AdamW lr) and of its AdamW
//     tensors, and any local problem (a non-finite hyperparameter, memory
//     no longer intact, a cancelled call). It reads no gradient: the ranks
//     agree while the trainers' backward still runs on the device. Workers
//     with no trainer send theirs once rank 0 opens the round for them.
//  2. Decide (DecideRound). Rank 0 broadcasts: the highest step committed
//     anywhere (C) and whether to resolve staged steps: a staged step <= C
//     commits from its staging (some rank committed it, and a rank commits
//     only after rank 0 decided), one > C is dropped (its rank 0 is here and
//     did not commit it, or its trainer's step record says so after it
//     restarted). A trainer whose parameters miss C (its worker restarted
//     before applying it, or part-way) gets kRepair: a peer's trainer's
//     parameters and the step's AdamW means (param_repair.h). DATA_LOSS
//     only when nothing can tell or repair it. Then kNoStep when a trainer
//     asks for a step <= C (those answer already_applied, the others open
//     another round), a kReject naming any disagreement, or kGo with the
//     step id.
//  3. Stage. The schedule's order: each bucket's gradients, once the
//     trainer's events say backward finished them (StepStaging), to owners
//     (replicated: none; unreduced: reduce, mean in trainer order;
//     row_sharded: gather rows); momentum + Newton-Schulz of every stack
//     this worker owns, the new momentum into the stack's next_momentum
//     (the old one untouched); the updates back (broadcast, or scatter rows)
//     into the trainer's staging buffer (peer writes: staging_windows.h);
//     the AdamW means into it too. Nothing the trainer or a later step sees
//     has changed, except where StepContext::apply_early allows the
//     updates into the parameters as they land (StepStaging::ApplyAsLanded):
//     decided there for one worker; among several, undone at the end of any
//     round that does not commit the step here (what they overwrote is
//     kept until then). A worker whose trainer asks for the step after its
//     last one, with nothing in doubt, computes its first stack before 1. when
//     that stack needs nothing from the peers (StepStaging::ComputeAhead):
//     it writes only the staging and the new momentum, which a round that
//     does not run that step drops.
//  4. Vote (RunCommitPhases). Each rank waits for its transfers, checks
//     every gradient it read (gradient_check.h), writes the new momentum it
//     owns to its checkpoint when the step is due for one (so a step that
//     commits anywhere is on disk at every owner), then votes (no, naming
//     it, for a non-finite gradient: INVALID_ARGUMENT on every rank; no if
//     its call was cancelled or passed its deadline, or the checkpoint
//     failed); a yes makes it prepared before the vote leaves. Rank
//     0 decides commit iff every vote arrived and was yes, and broadcasts it.
//  5. Commit (CommitStaged): the staged updates into the parameters, the
//     means into the AdamW gradients, next_momentum swapped in; last step
//     advances; the trainer's stream is released right after these writes
//     (the engine releases it again after the round, whatever happened).
//     Rank 0 commits once it decided, whatever its broadcast did.
//  6. Confirm. Every rank tells rank 0 it committed; rank 0 broadcasts
//     that all did, and each rank records the step as settled: a retry of
//     a settled step is answered locally (already_applied).
// Failures: before a rank votes, its staging is dropped (nothing changed
// anywhere: the retry redoes the step). A rank that voted and heard no
// decision is in doubt: it answers UNAVAILABLE saying so and keeps its
// staging; the retry's round commits or drops it (2.). A rank that
// committed but saw no confirmation answers UNAVAILABLE saying it applied
// the step, and its retry goes to a round too (peers may be in doubt). So
// once any rank commits, every live rank either committed or holds the
// staging to commit on its own, and a retry never applies a step twice.
// Trainers retry a failed step id until it is answered; the client applies
// AdamW once per committed step id (client.h). Liveness: a retry that needs
// a round is answered once every peer's trainer calls Step again (its retry,
// or its next step, which the round then settles first); a trainer blocked
// elsewhere (DDP's all-reduce waiting on the retrying rank) leaves it to
// fail within the timeout, with nothing applied twice. A worker that
// restarted learns what its trainer's parameters hold from the step record
// the trainer lends (lending/step_record.h), written in stream order by its
// predecessor: the steps it applied, and as rank 0 the steps it decided.
//
// Streams: step_staging.h. The vote waits for the transport and the
// stream, so a lost peer fails the step within the transport's timeout
// instead of hanging.
//
// A StepRun is used once, by one thread, under the engine's lock.
#ifndef MUONPS_SERVER_WORKER_STEP_RUN_H_
#define MUONPS_SERVER_WORKER_STEP_RUN_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/device_ops.h"
#include "kernels/muon_kernels.h"
#include "server/worker/step_agreement.h"
#include "server/worker/step_commit.h"
#include "server/worker/step_control.h"
#include "server/worker/step_protocol.h"
#include "server/worker/step_request.h"
#include "server/worker/step_staging.h"
#include "server/worker/step_state.h"
#include "server/worker/step_timeline.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// What a round runs with. Everything must outlive the run. `trainer` is
// null on a worker with no trainer (the plan's dedicated ranks, the last
// ones): its request is empty, it learns the step and what it needs of the
// trainers' tensors from rank 0, adds zeros to every sum, applies nothing.
struct StepContext {
  PlanState* plan = nullptr;
  const AttachedTrainer* trainer = nullptr;
  transport::Transport* transport = nullptr;
  kernels::DeviceOps* ops = nullptr;
  kernels::MuonKernels* kernels = nullptr;
  StepLedger* ledger = nullptr;
  absl::Duration timeout;
  StepCancelled cancelled;  // may be null
  StepHook hook;            // may be null
  // Makes the staged step durable when it is due for a checkpoint
  // (MomentumStore::PersistStaged); called between stage and vote, a
  // failure votes no. May be null.
  std::function<absl::Status(int64_t step_id)> persist;
  // Whether a step's updates may go into the parameters as they land
  // (StepStaging::ApplyAsLanded): decided as soon as its gradients are
  // checked where the worker is alone, undoably before the votes among
  // several. Not when a checkpoint of it is due (it commits only once that
  // is on disk), nor when a kill of this worker part-way through it would
  // otherwise lose nothing (its momentum on disk or resettable, or held by
  // another owner group too): a kill leaves the parameters part-way, which
  // only a peer trainer's copy repairs. May be null: never.
  std::function<bool(int64_t step_id)> apply_early;
};

// How a round ended.
struct RoundResult {
  enum class Kind {
    kStepped,         // the step committed everywhere: `response`
    kAlreadyApplied,  // the trainer's step was committed before
    kNoStep,          // no trainer here, and no step ran
    kAgain,           // the peers settled an older step: another round
  };
  Kind kind = Kind::kNoStep;
  // Not OK: the trainer's error (saying whether anything was applied).
  absl::Status status;
  // False: the transport is out of step with the peers; rebuild it.
  bool transport_ok = true;
  StepResponse response;
  // The round repaired this rank's trainer's parameters (kRepair's target).
  bool repaired = false;
};

class StepRun {
 public:
  explicit StepRun(const StepContext& context);
  StepRun(const StepRun&) = delete;
  StepRun& operator=(const StepRun&) = delete;

  // Runs one round for `request` (empty without a trainer).
  RoundResult Run(const StepRequest& request);

 private:
  // 3. (StepStaging, or `ahead`, the one whose first stack was computed
  // ahead of the agreement), then 4. to 6. (RunCommitPhases).
  RoundResult Stage(const StepRequest& request, const RoundDecision& decision,
                    const StepRoster& roster,
                    std::unique_ptr<StepStaging> ahead);
  // A staging of step `step_id`: drops what was staged before and checks
  // the momentum is as of the step before.
  std::unique_ptr<StepStaging> NewStaging(const StepRoster& roster,
                                          int64_t step_id);

  const StepContext context_;
  PlanState& plan_;
  StepLedger& ledger_;
  ControlChannel control_;
  StepTimeline timeline_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_RUN_H_
