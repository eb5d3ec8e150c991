// RoundAgreement: the opening of a round of a step (step_run.h, 1. and 2.).
// Every rank tells rank 0 what its trainer asks for and what it knows of
// the job's steps (step_protocol.h's StepHeader, with any local problem:
// a non-finite hyperparameter, lent memory no longer intact, a cancelled
// call); it reads no gradient, so the ranks agree while backward still runs
// (the gradients are checked before the vote: gradient_check.h); rank 0
// decides (DecideRound) and broadcasts the
// decision; on a kGo every rank learns the roster the step's transfers
// follow. Resolve then commits or drops a step staged in doubt as rank 0
// decided. Used once, by the step's thread, under the engine's lock.
#ifndef MUONPS_SERVER_WORKER_STEP_AGREEMENT_H_
#define MUONPS_SERVER_WORKER_STEP_AGREEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/device_ops.h"
#include "server/worker/step_commit.h"
#include "server/worker/step_control.h"
#include "server/worker/step_protocol.h"
#include "server/worker/step_request.h"
#include "server/worker/step_state.h"

namespace muonps {
namespace worker {

// What a kGo fixes for the step's transfers, the same on every rank.
struct StepRoster {
  // By worker rank: its trainer's rank (-1: no trainer).
  std::vector<int32_t> trainer_rank_of;
  // Worker ranks by trainer rank, then those with no trainer: the order
  // every sum adds the parts in (the trainers' parts alone keep their bits).
  std::vector<int> reduce_order;
  // What a worker with no trainer learns from rank 0 (empty elsewhere):
  // the unreduced AdamW tensors' sizes (name order), and by job matrix
  // whether its trainers keep the whole parameter of a row-sharded
  // gradient (1) or not (0).
  std::vector<int64_t> follower_adamw;
  std::vector<int64_t> follower_full_param;
};

class RoundAgreement {
 public:
  // Everything must outlive the agreement; `trainer` is null on a worker
  // with no trainer, `cancelled` may be null.
  RoundAgreement(PlanState& plan, const AttachedTrainer* trainer,
                 StepLedger& ledger, ControlChannel& control,
                 kernels::DeviceOps& ops, StepCancelled cancelled);
  RoundAgreement(const RoundAgreement&) = delete;
  RoundAgreement& operator=(const RoundAgreement&) = delete;

  // Opens the round for `request` (empty without a trainer) and fills
  // `decision` with rank 0's; on a kGo, roster() holds the step's roster.
  // `intact` is the trainer's memory check: not OK, its message is this
  // rank's problem (nothing of that memory is read). Errors are the
  // transport's: the ranks are out of step.
  absl::Status Agree(const StepRequest& request, const absl::Status& intact,
                     RoundDecision* decision);
  // Commits a staged step at or below decision.committed from its staging
  // and drops any other (when the decision resolves), and records the
  // committed step as settled.
  absl::Status Resolve(const RoundDecision& decision);
  // Resolve(decision) commits a staged step here (writing the trainer's
  // parameters and AdamW gradients).
  bool ResolveCommits(const RoundDecision& decision) const;

  const StepRoster& roster() const { return roster_; }

 private:
  // Rank 0, for a job of HSDP replica groups (JobSettings::replicas > 1):
  // why the plan's owner groups do not follow the trainers' replica groups
  // by the ranks' `headers` ("" when they do, or the job has none).
  std::string ReplicaGroupProblem(absl::Span<const StepHeader> headers) const;
  // Why this rank cannot step (OK: it can), with the code its rejection
  // carries: ABORTED for a call that was cancelled or passed its deadline
  // (a retry runs the step), INVALID_ARGUMENT for a request no retry
  // fixes, `intact`'s own for lent memory that is not whole.
  absl::Status LocalProblem(const StepRequest& request,
                            const absl::Status& intact);
  // Workers with no trainer learn of a round from their parent in the
  // control tree (RoundOpening), which tells its children with no trainer
  // once it is in the round itself: its trainer called, or its own parent
  // told it.
  absl::Status OpenRound();
  // Rank 0 tells workers with no trainer what they need of the trainers'
  // tensors (StepRoster's follower fields).
  absl::Status ShareFollowerInfo();
  // Every rank's window record to every rank, each opens those of its
  // host, and rank 0 tells which owners write into them (staging_windows.h).
  absl::Status ExchangeWindows(absl::Span<const uint64_t> ids);
  // Every rank reaches it before any leaves.
  absl::Status Barrier();

  PlanState& plan_;
  const AttachedTrainer* const trainer_;
  StepLedger& ledger_;
  ControlChannel& control_;
  kernels::DeviceOps& ops_;
  const StepCancelled cancelled_;
  const int trainers_;  // ranks with a trainer (the first ones)
  StepRoster roster_;
  bool barrier_ = false;  // RoundRoster::barrier of the round
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_AGREEMENT_H_
