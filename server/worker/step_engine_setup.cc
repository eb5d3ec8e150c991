// StepEngine's setup of a new plan version: its schedule and stacks,
// allocated before the engine's lock, then installed under it with the
// momentum (MomentumStore::Install: what stays, what moves away for the
// handover, which step_engine_transport.cc runs). A trainer's attachment
// is in step_engine_attach.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/step_engine.h"

namespace muonps {
namespace worker {
namespace {

// Floats the control messages of a step need in transport memory.
constexpr int64_t kControlFloats = 1024;

// What the version fixes of the momentum owned here.
MomentumStacks MomentumLayout(const PlanState& plan) {
  MomentumStacks layout;
  layout.version = plan.version;
  layout.rank = plan.rank;
  layout.matrices = plan.matrices;
  layout.owners = plan.ownership.owners;
  for (const ComputeBatch& batch : plan.batches) {
    MomentumStack stack;
    stack.rows = batch.rows;
    stack.cols = batch.cols;
    stack.items = batch.items;
    layout.stacks.push_back(std::move(stack));
  }
  layout.checkpoint_dir = plan.job.checkpoint_dir;
  layout.checkpoint_every = plan.job.checkpoint_every;
  layout.allow_momentum_reset = plan.job.allow_momentum_reset;
  return layout;
}

}  // namespace

absl::Status StepEngine::SetPlan(
    const JobPlan& plan, const std::map<std::string, std::string>& addresses) {
  absl::MutexLock changing(&plan_change_mu_);
  PlanState next;
  next.job = plan.job;
  next.version = plan.membership.version;
  next.matrices = plan.job.matrices;
  next.muon = plan.job.muon;
  next.ownership = plan.ownership;
  const std::vector<std::string>& workers = plan.membership.workers;
  for (size_t r = 0; r < workers.size(); ++r) {
    if (workers[r] == worker_id_) next.rank = static_cast<int>(r);
    auto it = addresses.find(workers[r]);
    next.addresses.push_back(it == addresses.end() ? "" : it->second);
  }
  MUONPS_ASSIGN_OR_RETURN(
      next.schedule,
      scheduler::BuildStepSchedule(next.matrices, next.ownership,
                                   {.bucket_bytes = plan.job.bucket_bytes}));
  int64_t largest = kControlFloats;
  for (const scheduler::MatrixSpec& spec : next.matrices) {
    largest = std::max(largest, spec.rows * spec.cols);
  }
  // The schedule's stacks this worker owns become its compute batches.
  next.batch_of_stack.assign(next.schedule.stacks.size(), -1);
  for (size_t k = 0; k < next.schedule.stacks.size(); ++k) {
    const scheduler::OwnerStack& stack = next.schedule.stacks[k];
    if (stack.owner != next.rank) continue;
    next.batch_of_stack[k] = static_cast<int>(next.batches.size());
    ComputeBatch batch;
    batch.rows = stack.rows;
    batch.cols = stack.cols;
    batch.items = stack.items;
    batch.chunks = stack.chunks;
    next.batches.push_back(std::move(batch));
  }
  // Allocated (and zero-filled) before the lock: Attach, heartbeats and
  // the momentum calls never wait for it; a step in progress goes on.
  for (ComputeBatch& batch : next.batches) {
    MUONPS_ASSIGN_OR_RETURN(
        batch.staged, ops_->Allocate(static_cast<int64_t>(batch.items.size()) *
                                         batch.rows * batch.cols,
                                     "staged gradients"));
  }
  MUONPS_ASSIGN_OR_RETURN(next.scratch, ops_->Allocate(largest, "scratch"));
  MUONPS_ASSIGN_OR_RETURN(PreparedMomentum momentum,
                          momentum_.Prepare(MomentumLayout(next)));
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
