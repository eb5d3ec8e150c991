// StepStaging: a round's stage (step_run.h, 3.), the data path of "One
// step's data flow" in docs/architecture.md. In the schedule's order: each
// bucket's gradients to their owners (replicated: none; unreduced: reduce, mean
// in trainer order, or across nodes summed in two levels,
// node_exchange_transfers.h; row_sharded: gather rows), momentum and
// Newton-Schulz of
// every stack this worker owns (the new momentum into its MomentumStack's
// next_momentum, the old one untouched), the updates back in the precision
// Newton-Schulz ran in (broadcast, or scatter rows) into the trainer's
// staged updates, and the unreduced AdamW means into its staged means, each
// recorded in the ledger's staged step for CommitStaged. Nothing the trainer or
// a later step sees changes.
//
// Streams: transfers on the ops' stream(), compute on compute_stream();
// bucket k+1's gradients move while bucket k's stacks compute, and each
// side waits for the other (DeviceOps::WaitForMark) only where it reads
// what the other wrote. Launches: each bucket's gradients to owners are one
// transport group, and so is each run of updates-back phases with nothing
// between them in the schedule's order (the tail after the last stack is one
// launch), and the AdamW means two. Used once, by the step's thread, under the
// engine's lock.
#ifndef MUONPS_SERVER_WORKER_STEP_STAGING_H_
#define MUONPS_SERVER_WORKER_STEP_STAGING_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/row_ranges.h"
#include "kernels/device_ops.h"
#include "kernels/muon_kernels.h"
#include "scheduler/step_schedule.h"
#include "server/worker/gradient_check.h"
#include "server/worker/momentum_store.h"
#include "server/worker/node_exchange_transfers.h"
#include "server/worker/row_relay.h"
#include "server/worker/step_agreement.h"
#include "server/worker/step_commit.h"
#include "server/worker/step_request.h"
#include "server/worker/step_state.h"
#include "server/worker/step_timeline.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// Widens a bf16 gradient into its fp32 copy, in `stream` order (an fp32
// binding is read in place: nothing to do).
absl::Status WidenGradient(const Binding& b, kernels::DeviceOps& ops,
                           Stream stream);

class StepStaging {
 public:
  // Everything must outlive the staging; `trainer` is null on a worker
  // with no trainer (it adds zeros to every sum and stages nothing);
  // `hook` may be null.
  StepStaging(PlanState& plan, const AttachedTrainer* trainer,
              transport::Transport& transport, kernels::DeviceOps& ops,
              kernels::MuonKernels& kernels, StepLedger& ledger,
              const StepRoster& roster, StepTimeline& timeline,
              const StepHook& hook, absl::Duration timeout);
  StepStaging(const StepStaging&) = delete;
  StepStaging& operator=(const StepStaging&) = delete;

  // Before the round's agreement: issues this worker's first stack of step
  // `step_id` when it needs nothing from the peers (every item replicated,
  // its gradient read in place from the trainer), so
  // its momentum and Newton-Schulz overlap the agreement's host work. They
  // write only the staging and the new momentum beside the old: a round
  // that runs another step or none drops them (DropStaged). The caller
  // makes sure nothing is staged and the momentum is as of step_id - 1.
  // Errors are the device's.
  absl::Status ComputeAhead(int64_t step_id);

  // Stages step `step_id` with `request`'s hyperparameters (by group
  // index), and returns once the transport's work and the stream are done
  // (a lost peer fails it within the timeout); a stack ComputeAhead issued
  // for the same step is not issued again. Errors leave the ranks out of
  // step: the caller drops the staging and the transport.
  absl::Status Stage(int64_t step_id, const StepRequest& request);

  // Before Stage: each run of updates goes into the parameters right after
  // it lands, on the transfer stream, beside the next stack's
  // Newton-Schulz (step_state.h's EarlyApply says when each is allowed):
  // - kDecided, for a step that needs no agreement once its gradients are
  //   checked (one worker, a trainer, no checkpoint due): Stage checks
  //   every gradient as soon as the trainer's step event says backward is
  //   done, and if all are finite decides the step there (the step record
  //   saying it is being applied). With a non-finite gradient nothing is
  //   applied and the step stages as any other (its vote says why). The
  //   host waits for those checks, so the stacks after the first computed
  //   ahead are issued once backward has finished (StepRun asks for this
  //   only where every gradient waits for the step's own event anyway).
  // - kUndoable, among several workers: every update, on the compute
  //   stream once this worker's last stack is issued there (so beside the
  //   updates still going back, not beside its Newton-Schulz), run after
  //   run: those this worker's stream orders after their landing mark, a
  //   peer's copies into its window after that writer's landing word
  //   (staging_windows.h); each run's parameters kept first
  //   (AttachedTrainer::kept, which must be allocated), the step record
  //   saying the step is being applied from the first of them. The
  //   transfer stream does not wait for them (a writer that fails leaves
  //   its words' waits blocked until the undo releases them): the commit
  //   does (StagedStep::applied_mark). On a GPU nothing waits on the host;
  //   the host's stream (the CPU) polls each landing word, within the
  //   timeout.
  void ApplyAsLanded(EarlyApply how) { early_ = how; }

  // After Stage, for a round that does not commit the step here: releases
  // the compute stream's waits for landing words (whether or not their
  // writers wrote them), then puts the parameters EarlyApply::kUndoable
  // wrote back as they were, in the transfer stream's order (behind
  // whatever the transport left there, which an abort ends), the step
  // record saying so; a step still staged (in doubt) then applies all of
  // its updates at its commit. OK with nothing to undo; else the device's
  // error.
  absl::Status UndoEarlyApplies();

  // After Stage: OK when every gradient this worker read from its trainer
  // is finite (GradientCheck::Result; OK without a trainer). Waits for the
  // transfer stream.
  absl::Status GradientsFinite();

  // Bytes this worker sent and received.
  int64_t bytes() const { return bytes_; }
  // Parameter elements written before the commit (ApplyAsLanded) and not
  // put back.
  int64_t applied_early() const { return applied_early_; }
  // ComputeAhead issued a stack.
  bool ahead() const { return ahead_; }

 private:
  // Makes the transfer stream wait for the trainer's gradients of
  // `matrices` not waited for yet this step (each one's own event where the
  // trainer lends one, else the step's) and widens the bf16 ones; sets
  // `*enqueued` when it enqueued anything.
  absl::Status ReadyGradients(absl::Span<const int32_t> matrices,
                              bool* enqueued);
  // The step's own event, then every gradient not readied yet and the
  // AdamW tensors' (widened), and their finite checks.
  absl::Status ReadyEveryGradient();
  // Clears the finite check, once a step (ComputeAhead or Stage).
  absl::Status PrepareCheck();
  // The bucket's gradients to their owners, but for those summed in two
  // levels (node_exchange_transfers.h), which it lists in `exchanged`.
  absl::Status ToOwners(const scheduler::Bucket& bucket,
                        std::vector<ExchangeItem>* exchanged);
  absl::Status Compute(ComputeBatch& batch, MomentumStack& stack);
  // The run's updates of unreduced matrices summed in two levels, after
  // the run's group: each bucket's gathered back and its applies staged.
  absl::Status GatherExchanged();
  absl::Status FromOwners(const scheduler::Bucket& bucket,
                          const StepRequest& request);
  // After a run of updates-back phases (FromOwners): sets this writer's
  // landing word in the window of each peer it copied into during the run,
  // in the transfer stream's order, and numbers the next run.
  absl::Status SignalLanded();
  // kUndoable: `applies` into the parameters on the compute stream, in its
  // order, what they overwrite kept first.
  absl::Status ApplyUndoably(const std::vector<ParamApply>& applies);
  // The landing word of the peer's copy `apply` (ParamApply::writer) in
  // this worker's window, or -1 where the commit applies it (no window
  // lent, no peer's copy, past kLandingWords writers or kMostLandingRuns
  // runs).
  int LandingSlot(const ParamApply& apply) const;
  absl::Status AverageAdamWGradients();
  // A worker with no trainer: its zero parts and a sink for the means.
  absl::Status PrepareFollowerBuffers();
  // A relay of row_sharded rows across the exchange nodes (row_relay.h) in
  // the plan's relay buffer: a bucket's gradients', or a run's updates'.
  std::unique_ptr<RowRelay> Relay();
  // After a run's group: its relays pass the updates' rows on.
  absl::Status ForwardRelayed();
  // Whether the trainers keep the whole parameter of `matrix` (row_sharded
  // gradients with replicated parameters: the update is broadcast).
  bool FullParam(int32_t matrix) const;
  // What trainer `trainer` holds of expert `expert` of the row_sharded
  // `spec` (common/row_ranges.h): possibly nothing, for whole experts.
  ExpertPart PartOfExpert(const scheduler::MatrixSpec& spec, int64_t expert,
                          int trainer) const;

  PlanState& plan_;
  const AttachedTrainer* const trainer_;  // null: no trainer
  transport::Transport& t_;
  kernels::DeviceOps& ops_;
  kernels::MuonKernels& kernels_;
  StepLedger& ledger_;
  const StepRoster& roster_;
  StepTimeline& timeline_;
  const StepHook& hook_;
  const absl::Duration timeout_;
  const Stream stream_;   // transfers
  const Stream compute_;  // momentum and Newton-Schulz
  const int trainers_;    // ranks with a trainer (the first ones)
  // The version's momentum (the store's installed stacks): read, and the
  // new momentum written beside it (momentum_store.h's device rule).
  MomentumStacks& momentum_;
  // By job matrix: the transfer stream waited for its gradient this step.
  std::vector<bool> ready_;
  // Each gradient checked as it is ready (empty without a trainer).
  std::optional<GradientCheck> check_;
  bool waited_trainer_ = false;  // for the step's own event
  bool every_ready_ = false;     // ReadyEveryGradient ran
  EarlyApply early_ = EarlyApply::kNone;
  // Of the staged applies, those looked at for an early apply.
  size_t scanned_ = 0;
  // Applied early and undoable (kUndoable), in order.
  std::vector<ParamApply> undoable_;
  // The runs of updates-back phases: the current one's number, and the
  // peers this worker copied updates into during it.
  int run_ = 0;
  std::vector<int> written_to_;
  // FromOwners's exchanged updates of the run in flight, by bucket.
  struct ExchangeGather {
    std::vector<ExchangeItem> items;
    std::vector<ParamApply> applies;
  };
  std::vector<ExchangeGather> gathers_;
  // The relays of the run of updates-back phases being issued (null: none
  // yet).
  std::unique_ptr<RowRelay> relayed_updates_;
  // Landing words compute_ waits for: released by UndoEarlyApplies.
  std::vector<int> awaited_slots_;
  int64_t applied_early_ = 0;
  int64_t step_id_ = -1;
  // ComputeAhead issued the first own stack: the step's first mark, and
  // the mark after that stack.
  bool ahead_ = false;
  int begin_mark_ = -1;
  int ahead_done_mark_ = -1;
  int64_t bytes_ = 0;
  // A worker with no trainer: what the open run of updates-back phases
  // (one group) has landed in plan_.sink, in elements of the update dtype.
  int64_t landed_ = 0;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_STAGING_H_
