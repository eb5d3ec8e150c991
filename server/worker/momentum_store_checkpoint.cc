// MomentumStore's checkpoint calls: the snapshot after a commit (copied
// under the lock; MomentumCheckpoints writes it outside), the checkpoint
// RPC's request and read, and the restores (MomentumCheckpoints reads and
// decides outside the lock; the store copies what may be installed).
#include <utility>
#include <vector>

#include "common/status.h"
#include "server/worker/momentum_store.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

std::vector<MomentumCheckpoints::Expert> MomentumStore::Owned(
    bool missing_only) const {
  std::vector<MomentumCheckpoints::Expert> out;
  const MomentumStacks& now = *stacks_;
  for (size_t m = 0; m < now.matrices.size(); ++m) {
    for (int64_t e = 0; e < now.matrices[m].experts; ++e) {
      const ItemSlot slot = now.slot(m, e);
      if (slot.batch < 0 || (missing_only && now.has_momentum(slot))) continue;
      out.push_back({static_cast<int>(m), e, now.matrices[m]});
    }
  }
  return out;
}

absl::StatusOr<int64_t> MomentumStore::RequestCheckpoint() {
  absl::MutexLock lock(&mu_);
  return checkpoints_.Request(stacks_->checkpoint_dir);
}

std::optional<CheckpointSnapshot> MomentumStore::TakeSnapshot(
    int64_t last_committed) {
  absl::MutexLock lock(&mu_);
  const MomentumStacks& now = *stacks_;
  if (!checkpoints_.Due(now.checkpoint_dir, now.checkpoint_every,
                        last_committed)) {
    return std::nullopt;
  }
  absl::StatusOr<std::vector<SnapshotTensor>> tensors = now.OwnedToHost(*ops_);
  if (!tensors.ok()) {
    spdlog::error("worker={} step={} checkpoint not taken: {}", worker_id_,
                  last_committed, tensors.status().ToString());
    return std::nullopt;
  }
  checkpoints_.Taken(last_committed);
  return CheckpointSnapshot{now.checkpoint_dir, last_committed, now.version,
                            std::move(*tensors)};
}

absl::Status MomentumStore::RestoreMissing(int64_t committed) {
  std::vector<MomentumCheckpoints::Expert> missing;
  std::string dir;
  int64_t version = -1;
  {
    absl::MutexLock lock(&mu_);
    dir = stacks_->checkpoint_dir;
    version = stacks_->version;
    if (!checkpoints_.enabled() || dir.empty() || stacks_->rank < 0) {
      return absl::OkStatus();
    }
    missing = Owned(/*missing_only=*/true);
  }
  if (missing.empty()) return absl::OkStatus();
  int64_t reference = -1;
  MUONPS_ASSIGN_OR_RETURN(
      std::vector<MomentumCheckpoints::Found> found,
      checkpoints_.FindMissing(dir, version, std::move(missing), committed,
                               &reference));
  int64_t restored = 0;
  for (const MomentumCheckpoints::Found& x : found) {
    absl::MutexLock lock(&mu_);
    if (stacks_->version != version) break;  // replaced meanwhile
    const ItemSlot slot = stacks_->slot(x.expert.matrix, x.expert.expert);
    MomentumStack& stack = stacks_->stacks[slot.batch];
    const int64_t size = static_cast<int64_t>(x.values.size());
    MUONPS_RETURN_IF_ERROR(
        ops_->Copy(stack.at(slot.slot), x.values.data(), size, ops_->stream()));
    // A step staged in doubt commits its next_momentum: it gets the
    // restored momentum too where it had none for this slot.
    if (stack.next_valid && !stack.next_has_momentum[slot.slot]) {
      MUONPS_RETURN_IF_ERROR(ops_->Copy(stack.next_at(slot.slot),
                                        x.values.data(), size, ops_->stream()));
      stack.next_has_momentum[slot.slot] = true;
    }
    MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
    stack.has_momentum[slot.slot] = true;
    ++restored;
  }
  checkpoints_.RestoredMissing(dir, version, reference, committed, restored);
  return absl::OkStatus();
}

void MomentumStore::CheckRestoredStep(int64_t step_id, int64_t committed) {
  const int64_t restored = checkpoints_.TakeUnverified(step_id, committed);
  if (restored < 0) return;
  absl::MutexLock lock(&mu_);
  // Zero, as a new owner with nothing to restore starts (the step reads
  // the buffer, not has_momentum).
  int64_t dropped = 0;
  absl::Status zeroed;
  for (MomentumStack& stack : stacks_->stacks) {
    for (size_t s = 0; s < stack.has_momentum.size(); ++s) {
      if (!stack.has_momentum[s]) continue;
      ++dropped;
      stack.has_momentum[s] = false;
      if (zeroed.ok()) {
        zeroed = ops_->Scale(stack.at(static_cast<int>(s)), stack.floats(),
                             0.0f, ops_->stream());
      }
    }
  }
  if (zeroed.ok()) zeroed = ops_->Synchronize(ops_->stream());
  if (!zeroed.ok()) {
    spdlog::error(
        "worker={} zeroing momentum restored as of step {} failed: {}",
        worker_id_, restored, zeroed.ToString());
  }
  resets_ += dropped;
  resets_total_ += dropped;
  checkpoints_.Dropped(dropped);
  spdlog::error(
      "worker={} plan_version={} momentum of {} owned experts was restored as "
      "of step {}, but the trainer asks for step {}, not {}: they start from "
      "zero instead",
      worker_id_, stacks_->version, dropped, restored, step_id, restored + 1);
}

absl::StatusOr<CheckedMomentum> MomentumStore::ReadCheckpoint(
    const std::string& dir, int64_t step) const {
  std::vector<MomentumCheckpoints::Expert> owned;
  int64_t version = -1;
  {
    absl::MutexLock lock(&mu_);
    if (stacks_->rank < 0 && !dir.empty() && dir[0] == '/' && step >= 0) {
      return NoPlan();
    }
    version = stacks_->version;
    owned = Owned(/*missing_only=*/false);
  }
  return checkpoints_.Read(dir, step, version, owned);
}

}  // namespace worker
}  // namespace muonps
