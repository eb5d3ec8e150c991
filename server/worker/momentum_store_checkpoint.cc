// MomentumStore's checkpoints: the snapshot after a commit (copied under
// the lock, written outside it), the checkpoint RPC's request, and the
// restores (checkpoint_restore.h has the rule: momentum as of the job's
// step, never another).
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/momentum_store.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

void MomentumStore::EnableCheckpoints(MetricsRegistry* metrics) {
  writer_ = std::make_unique<CheckpointWriter>(worker_id_, metrics);
  if (metrics != nullptr) {
    restores_ = metrics->AddCounter(
        "muonps_worker_momentum_restores_total",
        "Owned experts whose missing momentum was looked up in the job's "
        "checkpoints: restored, stale (a checkpoint of another step than "
        "the job's; left at zero) or missing (in no checkpoint).",
        {"result"});
  }
}

void MomentumStore::CountRestores(int64_t restored, int64_t stale,
                                  int64_t missing) {
  if (restores_ == nullptr) return;
  if (restored > 0) restores_->Increment({"restored"}, restored);
  if (stale > 0) restores_->Increment({"stale"}, stale);
  if (missing > 0) restores_->Increment({"missing"}, missing);
}

int64_t MomentumStore::last_checkpoint_step() const {
  return writer_ == nullptr ? -1 : writer_->last_written();
}

absl::Status MomentumStore::WaitForCheckpoint() {
  return writer_ == nullptr ? absl::OkStatus() : writer_->WaitIdle();
}

absl::StatusOr<int64_t> MomentumStore::RequestCheckpoint() {
  absl::MutexLock lock(&mu_);
  if (writer_ == nullptr || stacks_->checkpoint_dir.empty()) {
    return FieldError(absl::StatusCode::kFailedPrecondition,
                      "job.checkpoint_dir",
                      absl::StrCat("worker ", Quoted(worker_id_),
                                   " has no checkpoint directory: the job "
                                   "sets none"));
  }
  checkpoint_requested_ = true;
  spdlog::info("worker={} checkpoint requested after the next committed step",
               worker_id_);
  return writer_->last_written();
}

std::optional<CheckpointSnapshot> MomentumStore::TakeSnapshot(
    int64_t last_committed) {
  if (writer_ == nullptr) return std::nullopt;
  absl::MutexLock lock(&mu_);
  const MomentumStacks& now = *stacks_;
  const int64_t last = last_committed;
  if (now.checkpoint_dir.empty() || last < 0 || last <= checkpointed_step_) {
    return std::nullopt;
  }
  const int64_t every = now.checkpoint_every;
  if (!checkpoint_requested_ && !(every > 0 && last % every == 0)) {
    return std::nullopt;
  }
  absl::StatusOr<std::vector<SnapshotTensor>> tensors = now.OwnedToHost(*ops_);
  if (!tensors.ok()) {
    spdlog::error("worker={} step={} checkpoint not taken: {}", worker_id_,
                  last, tensors.status().ToString());
    return std::nullopt;
  }
  CheckpointSnapshot snapshot;
  snapshot.checkpoint_dir = now.checkpoint_dir;
  snapshot.step = last;
  snapshot.plan_version = now.version;
  snapshot.tensors = std::move(*tensors);
  checkpointed_step_ = last;
  checkpoint_requested_ = false;
  return snapshot;
}

void MomentumStore::Submit(CheckpointSnapshot snapshot) {
  if (writer_ == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    if (snapshot.step <= submitted_step_) return;
    submitted_step_ = snapshot.step;
  }
  writer_->Submit(std::move(snapshot));
}

absl::Status MomentumStore::RestoreMissing(int64_t committed) {
  struct Missing {
    int matrix;
    int64_t expert;
    scheduler::MatrixSpec spec;
  };
  std::vector<Missing> missing;
  std::string dir;
  int64_t version = -1;
  {
    absl::MutexLock lock(&mu_);
    const MomentumStacks& now = *stacks_;
    dir = now.checkpoint_dir;
    version = now.version;
    if (writer_ == nullptr || dir.empty() || now.rank < 0) {
      return absl::OkStatus();
    }
    for (size_t m = 0; m < now.matrices.size(); ++m) {
      for (int64_t e = 0; e < now.matrices[m].experts; ++e) {
        const ItemSlot slot = now.slot(m, e);
        if (slot.batch >= 0 && !now.has_momentum(slot)) {
          missing.push_back({static_cast<int>(m), e, now.matrices[m]});
        }
      }
    }
  }
  if (missing.empty()) return absl::OkStatus();
  MUONPS_ASSIGN_OR_RETURN(const CheckpointCatalog catalog,
                          CheckpointCatalog::Load(dir));
  if (catalog.empty()) return absl::OkStatus();
  // A worker that has committed nothing takes the newest checkpoint's
  // step: its trainer must resume from there.
  const int64_t reference = committed >= 0 ? committed : catalog.newest_step();
  int64_t restored = 0, stale = 0, absent = 0;
  for (const Missing& x : missing) {
    const std::string& name = x.spec.name;
    std::vector<float> values(x.spec.rows * x.spec.cols);
    const absl::StatusOr<int64_t> step = catalog.Restore(
        name, x.expert, x.spec.rows, x.spec.cols, values.data());
    const std::pair<int, int64_t> key(x.matrix, x.expert);
    absl::MutexLock lock(&mu_);
    if (stacks_->version != version) break;  // replaced meanwhile
    if (!step.ok()) {
      if (!absl::IsNotFound(step.status())) {
        spdlog::error(
            "worker={} plan_version={} momentum of {} expert {} not "
            "restored: {}",
            worker_id_, version, Quoted(name), x.expert,
            step.status().ToString());
      } else {
        item_restores_[key] = {reference, committed, false,
                               std::string(step.status().message())};
      }
      ++absent;
      continue;
    }
    if (*step != reference) {
      item_restores_[key] = {
          reference, committed, false,
          absl::StrCat("the newest checkpoint holding matrix ", Quoted(name),
                       " expert ", x.expert, " is of step ", *step,
                       "; the job is at step ", reference)};
      spdlog::warn(
          "worker={} plan_version={} momentum of {} expert {} left at zero: "
          "the newest checkpoint holding it is of step {}, the job's step "
          "here is {}",
          worker_id_, version, Quoted(name), x.expert, *step, reference);
      ++stale;
      continue;
    }
    const ItemSlot slot = stacks_->slot(x.matrix, x.expert);
    MomentumStack& stack = stacks_->stacks[slot.batch];
    const int64_t size = static_cast<int64_t>(values.size());
    MUONPS_RETURN_IF_ERROR(
        ops_->Copy(stack.at(slot.slot), values.data(), size, ops_->stream()));
    // A step staged in doubt commits its next_momentum: it gets the
    // restored momentum too where it had none for this slot.
    if (stack.next_valid && !stack.next_has_momentum[slot.slot]) {
      MUONPS_RETURN_IF_ERROR(ops_->Copy(stack.next_at(slot.slot), values.data(),
                                        size, ops_->stream()));
      stack.next_has_momentum[slot.slot] = true;
    }
    MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
    stack.has_momentum[slot.slot] = true;
    item_restores_[key] = {reference, committed, true, ""};
    ++restored;
  }
  CountRestores(restored, stale, absent);
  if (restored > 0) {
    restored_step_.store(reference);
    absl::MutexLock lock(&mu_);
    if (committed < 0) restore_unverified_ = reference;
  }
  if (restored > 0 && committed < 0) {
    spdlog::warn(
        "worker={} plan_version={} restored the momentum of {} owned "
        "experts as of step {} from {}: valid only if the trainer resumes "
        "from step {} (its next step is {})",
        worker_id_, version, restored, reference, dir, reference,
        reference + 1);
  } else if (restored > 0) {
    spdlog::info(
        "worker={} plan_version={} restored the momentum of {} owned experts "
        "as of step {} from {}",
        worker_id_, version, restored, reference, dir);
  }
  if (stale + absent > 0) {
    spdlog::warn(
        "worker={} plan_version={} {} owned experts have no checkpoint of "
        "step {} ({} of another step, {} in none): they start from zero",
        worker_id_, version, stale + absent, reference, stale, absent);
  }
  return absl::OkStatus();
}

void MomentumStore::CheckRestoredStep(int64_t step_id, int64_t committed) {
  absl::MutexLock lock(&mu_);
  const int64_t restored = restore_unverified_;
  if (restored < 0) return;
  restore_unverified_ = -1;
  if (step_id == restored + 1 || committed >= 0) return;
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
  CountRestores(0, dropped, 0);
  spdlog::error(
      "worker={} plan_version={} momentum of {} owned experts was restored as "
      "of step {}, but the trainer asks for step {}, not {}: they start from "
      "zero instead",
      worker_id_, stacks_->version, dropped, restored, step_id, restored + 1);
}

absl::StatusOr<CheckedMomentum> MomentumStore::ReadCheckpoint(
    const std::string& dir, int64_t step) const {
  if (dir.empty() || dir[0] != '/') {
    return InvalidField("checkpoint_dir",
                        absl::StrCat(Quoted(dir), " is not an absolute path"));
  }
  if (step < 0) return InvalidField("step", absl::StrCat(step, " < 0"));
  CheckedMomentum out;
  out.checkpoint_step = step;
  out.checkpoint_dir = dir;
  std::vector<std::pair<scheduler::MatrixSpec, int64_t>> owned;
  {
    absl::MutexLock lock(&mu_);
    const MomentumStacks& now = *stacks_;
    if (now.rank < 0) return NoPlan();
    out.version = now.version;
    for (size_t m = 0; m < now.matrices.size(); ++m) {
      for (int64_t e = 0; e < now.matrices[m].experts; ++e) {
        if (now.slot(m, e).batch >= 0) owned.emplace_back(now.matrices[m], e);
      }
    }
  }
  MUONPS_ASSIGN_OR_RETURN(const CheckpointCatalog catalog,
                          CheckpointCatalog::Load(dir, step));
  for (const auto& [spec, e] : owned) {
    std::vector<float> values(spec.rows * spec.cols);
    const absl::StatusOr<int64_t> found =
        catalog.Restore(spec.name, e, spec.rows, spec.cols, values.data());
    if (!found.ok()) {
      return Annotate(found.status(), absl::StrCat("checkpoint of step ", step,
                                                   " in ", Quoted(dir)));
    }
    out.experts.push_back({spec.name, e, std::move(values)});
  }
  return out;
}

}  // namespace worker
}  // namespace muonps
