// StepEngine's setup of a new plan version: its schedule and stacks,
// allocated before the engine's lock, then installed under it with the
// momentum (MomentumStore::Install: what stays, what moves away for the
// handover, which step_engine_transport.cc runs). A trainer's attachment
// is in step_engine_attach.cc.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/step_engine.h"

namespace muonps {
namespace worker {
absl::Status StepEngine::SetPlan(
    const JobPlan& plan, const std::map<std::string, std::string>& addresses) {
  absl::MutexLock changing(&plan_change_mu_);
  MUONPS_ASSIGN_OR_RETURN(PlanState next,
                          BuildPlanState(plan, addresses, worker_id_));
  // Allocated (and zero-filled) before the lock: Attach, heartbeats and
  // the momentum calls never wait for it; a step in progress goes on.
  MUONPS_RETURN_IF_ERROR(next.AllocateBuffers(*ops_));
  MUONPS_ASSIGN_OR_RETURN(PreparedMomentum momentum,
                          momentum_.Prepare(next.MomentumLayout()));
  next.momentum = &momentum_;
  PlanState replaced;  // freed once the lock is released
  absl::MutexLock lock(&mu_);
  // The transport of the old version goes first: its pending work may
  // still name the old buffers. Aborted, not finalized: a finalize waits
  // for peers that may be gone.
  transport_.Drop(absl::CancelledError(
      absl::StrCat("plan version ", next.version, " replaced it")));
  // Momentum of items this worker keeps owning moves to the new stacks; so
  // does a step staged in doubt (its new momentum), which may still commit.
  MUONPS_RETURN_IF_ERROR(
      momentum_.Install(std::move(momentum), ledger_.staged.voted));
  replaced = std::exchange(plan_, std::move(next));
  transport_.Publish(plan_.version, plan_.ownership.worker_ids);
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
