// StepEngine's momentum checkpoints: the snapshot after a commit, the
// checkpoint RPC's request, and the restore after a new plan
// (step_engine.h says when each happens; checkpoint_restore.h the rule).
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/checkpoint_restore.h"
#include "server/worker/step_engine.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

void StepEngine::EnableCheckpoints(MetricsRegistry* metrics) {
  absl::MutexLock lock(&mu_);
  checkpoint_writer_ = std::make_unique<CheckpointWriter>(worker_id_, metrics);
  if (metrics != nullptr) {
    restores_ = metrics->AddCounter(
        "muonps_worker_momentum_restores_total",
        "Owned experts whose missing momentum was looked up in the job's "
        "checkpoints: restored, stale (a checkpoint of another step than "
        "the job's; left at zero) or missing (in no checkpoint).",
        {"result"});
  }
}

int64_t StepEngine::last_checkpoint_step() const {
  return checkpoint_writer_ == nullptr ? -1
                                       : checkpoint_writer_->last_written();
}

absl::Status StepEngine::WaitForCheckpoint() {
  return checkpoint_writer_ == nullptr ? absl::OkStatus()
                                       : checkpoint_writer_->WaitIdle();
}

absl::StatusOr<int64_t> StepEngine::RequestCheckpoint() {
  absl::MutexLock lock(&mu_);
  if (checkpoint_writer_ == nullptr || plan_.job.checkpoint_dir.empty()) {
    return FieldError(absl::StatusCode::kFailedPrecondition,
                      "job.checkpoint_dir",
                      absl::StrCat("worker ", Quoted(worker_id_),
                                   " has no checkpoint directory: the job "
                                   "sets none"));
  }
  checkpoint_requested_.store(true);
  spdlog::info("worker={} checkpoint requested after the next committed step",
               worker_id_);
  return checkpoint_writer_->last_written();
}

void StepEngine::MaybeCheckpoint() {
  if (checkpoint_writer_ == nullptr || plan_.job.checkpoint_dir.empty()) {
    return;
  }
  const int64_t last = ledger_.last.load();
  if (last < 0 || last <= checkpointed_step_) return;
  const int64_t every = plan_.job.checkpoint_every;
  const bool asked = checkpoint_requested_.load();
  if (!asked && !(every > 0 && last % every == 0)) return;
  CheckpointSnapshot snapshot;
  snapshot.checkpoint_dir = plan_.job.checkpoint_dir;
  snapshot.step = last;
  snapshot.plan_version = plan_.version;
  kernels::DeviceOps& ops = *backend_.ops;
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    for (size_t e = 0; e < plan_.slots[m].size(); ++e) {
      const ItemSlot& slot = plan_.slots[m][e];
      if (slot.batch < 0) continue;
      const ComputeBatch& batch = plan_.batches[slot.batch];
      if (!batch.has_momentum[slot.slot]) continue;
      SnapshotTensor t;
      t.name = plan_.matrices[m].name;
      t.expert = static_cast<int32_t>(e);
      t.rows = batch.rows;
      t.cols = batch.cols;
      t.values.resize(batch.rows * batch.cols);
      const absl::Status copied =
          ops.Copy(t.values.data(), plan_.SlotData(slot, true),
                   static_cast<int64_t>(t.values.size()), ops.stream());
      if (!copied.ok()) {
        spdlog::error("worker={} step={} checkpoint not taken: {}", worker_id_,
                      last, copied.ToString());
        return;
      }
      snapshot.tensors.push_back(std::move(t));
    }
  }
  if (const absl::Status synced = ops.Synchronize(ops.stream()); !synced.ok()) {
    spdlog::error("worker={} step={} checkpoint not taken: {}", worker_id_,
                  last, synced.ToString());
    return;
  }
  checkpoint_writer_->Submit(std::move(snapshot));
  checkpointed_step_ = last;
  if (asked) checkpoint_requested_.store(false);
}

absl::Status StepEngine::RestoreMissingMomentum() {
  absl::MutexLock lock(&mu_);
  const std::string& dir = plan_.job.checkpoint_dir;
  if (checkpoint_writer_ == nullptr || dir.empty() || plan_.rank < 0) {
    return absl::OkStatus();
  }
  std::vector<std::pair<size_t, size_t>> missing;
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    for (size_t e = 0; e < plan_.slots[m].size(); ++e) {
      const ItemSlot& slot = plan_.slots[m][e];
      if (slot.batch >= 0 &&
          !plan_.batches[slot.batch].has_momentum[slot.slot]) {
        missing.emplace_back(m, e);
      }
    }
  }
  if (missing.empty()) return absl::OkStatus();
  MUONPS_ASSIGN_OR_RETURN(const CheckpointCatalog catalog,
                          CheckpointCatalog::Load(dir));
  if (catalog.empty()) return absl::OkStatus();
  const int64_t committed = ledger_.last.load();
  // A worker that has committed nothing takes the newest checkpoint's
  // step: its trainer must resume from there.
  const int64_t reference = committed >= 0 ? committed : catalog.newest_step();
  kernels::DeviceOps& ops = *backend_.ops;
  int64_t restored = 0, stale = 0, absent = 0;
  for (const auto& [m, e] : missing) {
    const std::string& name = plan_.matrices[m].name;
    const ItemSlot& slot = plan_.slots[m][e];
    ComputeBatch& batch = plan_.batches[slot.batch];
    std::vector<float> values(batch.rows * batch.cols);
    const absl::StatusOr<int64_t> step = catalog.Restore(
        name, static_cast<int64_t>(e), batch.rows, batch.cols, values.data());
    const std::pair<int, int64_t> key(static_cast<int>(m),
                                      static_cast<int64_t>(e));
    if (!step.ok()) {
      if (!absl::IsNotFound(step.status())) {
        spdlog::error(
            "worker={} plan_version={} momentum of {} expert {} not "
            "restored: {}",
            worker_id_, plan_.version, Quoted(name), e,
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
                       " expert ", e, " is of step ", *step,
                       "; the job is at step ", reference)};
      spdlog::warn(
          "worker={} plan_version={} momentum of {} expert {} left at zero: "
          "the newest checkpoint holding it is of step {}, the job's step "
          "here is {}",
          worker_id_, plan_.version, Quoted(name), e, *step, reference);
      ++stale;
      continue;
    }
    const int64_t size = static_cast<int64_t>(values.size());
    MUONPS_RETURN_IF_ERROR(ops.Copy(plan_.SlotData(slot, true), values.data(),
                                    size, ops.stream()));
    // A step staged in doubt commits its next_momentum: it gets the
    // restored momentum too where it had none for this slot.
    if (batch.next_valid && !batch.next_has_momentum[slot.slot]) {
      MUONPS_RETURN_IF_ERROR(
          ops.Copy(batch.next_momentum->data() + slot.slot * size,
                   values.data(), size, ops.stream()));
      batch.next_has_momentum[slot.slot] = true;
    }
    MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
    batch.has_momentum[slot.slot] = true;
    item_restores_[key] = {reference, committed, true, ""};
    ++restored;
  }
  if (restores_ != nullptr) {
    if (restored > 0) restores_->Increment({"restored"}, restored);
    if (stale > 0) restores_->Increment({"stale"}, stale);
    if (absent > 0) restores_->Increment({"missing"}, absent);
  }
  if (restored > 0) restored_step_.store(reference);
  if (restored > 0 && committed < 0) restore_unverified_ = reference;
  if (restored > 0 && committed < 0) {
    spdlog::warn(
        "worker={} plan_version={} restored the momentum of {} owned "
        "experts as of step {} from {}: valid only if the trainer resumes "
        "from step {} (its next step is {})",
        worker_id_, plan_.version, restored, reference, dir, reference,
        reference + 1);
  } else if (restored > 0) {
    spdlog::info(
        "worker={} plan_version={} restored the momentum of {} owned experts "
        "as of step {} from {}",
        worker_id_, plan_.version, restored, reference, dir);
  }
  if (stale + absent > 0) {
    spdlog::warn(
        "worker={} plan_version={} {} owned experts have no checkpoint of "
        "step {} ({} of another step, {} in none): they start from zero",
        worker_id_, plan_.version, stale + absent, reference, stale, absent);
  }
  return absl::OkStatus();
}

void StepEngine::CheckRestoredStep(int64_t step_id) {
  const int64_t restored = restore_unverified_;
  if (restored < 0) return;
  restore_unverified_ = -1;
  if (step_id == restored + 1 || ledger_.last.load() >= 0) return;
  // Zero, as a new owner with nothing to restore starts (the step reads
  // the buffer, not has_momentum).
  kernels::DeviceOps& ops = *backend_.ops;
  int64_t dropped = 0;
  absl::Status zeroed;
  for (ComputeBatch& batch : plan_.batches) {
    const int64_t size = batch.rows * batch.cols;
    for (size_t s = 0; s < batch.has_momentum.size(); ++s) {
      if (!batch.has_momentum[s]) continue;
      ++dropped;
      batch.has_momentum[s] = false;
      if (zeroed.ok()) {
        zeroed = ops.Scale(batch.momentum->data() + s * size, size, 0.0f,
                           ops.stream());
      }
    }
  }
  if (zeroed.ok()) zeroed = ops.Synchronize(ops.stream());
  if (!zeroed.ok()) {
    spdlog::error(
        "worker={} zeroing momentum restored as of step {} failed: {}",
        worker_id_, restored, zeroed.ToString());
  }
  momentum_resets_ += dropped;
  momentum_resets_total_ += dropped;
  if (restores_ != nullptr && dropped > 0) {
    restores_->Increment({"stale"}, static_cast<double>(dropped));
  }
  spdlog::error(
      "worker={} plan_version={} momentum of {} owned experts was restored as "
      "of step {}, but the trainer asks for step {}, not {}: they start from "
      "zero instead",
      worker_id_, plan_.version, dropped, restored, step_id, restored + 1);
}

absl::StatusOr<int64_t> StepEngine::RestoreCheckpoint(const std::string& dir,
                                                      int64_t step) {
  if (dir.empty() || dir[0] != '/') {
    return InvalidField("checkpoint_dir",
                        absl::StrCat(Quoted(dir), " is not an absolute path"));
  }
  if (step < 0) return InvalidField("step", absl::StrCat(step, " < 0"));
  absl::MutexLock lock(&mu_);
  if (plan_.rank < 0) return NoPlanYet();
  MUONPS_ASSIGN_OR_RETURN(const CheckpointCatalog catalog,
                          CheckpointCatalog::Load(dir, step));
  // Everything is read and checked before anything changes.
  std::vector<std::pair<ItemSlot, std::vector<float>>> restored;
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    for (size_t e = 0; e < plan_.slots[m].size(); ++e) {
      const ItemSlot& slot = plan_.slots[m][e];
      if (slot.batch < 0) continue;
      const ComputeBatch& batch = plan_.batches[slot.batch];
      std::vector<float> values(batch.rows * batch.cols);
      const absl::StatusOr<int64_t> found =
          catalog.Restore(plan_.matrices[m].name, static_cast<int64_t>(e),
                          batch.rows, batch.cols, values.data());
      if (!found.ok()) {
        return Annotate(
            found.status(),
            absl::StrCat("checkpoint of step ", step, " in ", Quoted(dir)));
      }
      restored.emplace_back(slot, std::move(values));
    }
  }
  if (ledger_.staged.step_id >= 0) {
    spdlog::warn(
        "worker={} step={} staged in doubt: dropped, momentum is being "
        "restored from a checkpoint",
        worker_id_, ledger_.staged.step_id);
    DropStaged(ledger_, plan_);
  }
  kernels::DeviceOps& ops = *backend_.ops;
  for (auto& [slot, values] : restored) {
    MUONPS_RETURN_IF_ERROR(ops.Copy(plan_.SlotData(slot, true), values.data(),
                                    static_cast<int64_t>(values.size()),
                                    ops.stream()));
  }
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  for (const auto& [slot, values] : restored) {
    plan_.batches[slot.batch].has_momentum[slot.slot] = true;
  }
  item_restores_.clear();  // the slots hold this restore's step now
  restored_step_.store(step);
  if (ledger_.last.load() < 0) restore_unverified_ = step;
  if (restores_ != nullptr && !restored.empty()) {
    restores_->Increment({"restored"}, static_cast<double>(restored.size()));
  }
  spdlog::info(
      "worker={} plan_version={} momentum of {} owned experts restored from "
      "the checkpoint of step {} in {}",
      worker_id_, plan_.version, restored.size(), step, dir);
  return static_cast<int64_t>(restored.size());
}

}  // namespace worker
}  // namespace muonps
