#include "server/worker/momentum_checkpoints.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

MomentumCheckpoints::MomentumCheckpoints(std::string worker_id)
    : worker_id_(std::move(worker_id)) {}

MomentumCheckpoints::~MomentumCheckpoints() {
  if (writer_ != nullptr) writer_->WaitIdle().IgnoreError();
}

void MomentumCheckpoints::Enable(MetricsRegistry* metrics) {
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

void MomentumCheckpoints::Count(int64_t restored, int64_t stale,
                                int64_t missing) {
  if (restores_ == nullptr) return;
  if (restored > 0) restores_->Increment({"restored"}, restored);
  if (stale > 0) restores_->Increment({"stale"}, stale);
  if (missing > 0) restores_->Increment({"missing"}, missing);
}

absl::StatusOr<int64_t> MomentumCheckpoints::Request(const std::string& dir) {
  if (writer_ == nullptr || dir.empty()) {
    return FieldError(absl::StatusCode::kFailedPrecondition,
                      "job.checkpoint_dir",
                      absl::StrCat("worker ", Quoted(worker_id_),
                                   " has no checkpoint directory: the job "
                                   "sets none"));
  }
  {
    absl::MutexLock lock(&mu_);
    requested_ = true;
  }
  spdlog::info("worker={} checkpoint requested after the next committed step",
               worker_id_);
  return writer_->last_written();
}

bool MomentumCheckpoints::Due(const std::string& dir, int64_t every,
                              int64_t step, int64_t version) const {
  if (writer_ == nullptr || dir.empty() || step < 0) return false;
  absl::MutexLock lock(&mu_);
  const bool written = step < written_step_ ||
                       (step == written_step_ && version == written_version_);
  return !written && (requested_ || (every > 0 && step % every == 0));
}

absl::Status MomentumCheckpoints::Write(CheckpointSnapshot snapshot) {
  if (writer_ == nullptr) {
    return absl::FailedPreconditionError("checkpoints are not enabled");
  }
  const int64_t step = snapshot.step;
  const int64_t version = snapshot.plan_version;
  writer_->Submit(std::move(snapshot));
  MUONPS_RETURN_IF_ERROR(writer_->WaitIdle());
  absl::MutexLock lock(&mu_);
  written_step_ = step;
  written_version_ = version;
  requested_ = false;
  return absl::OkStatus();
}

int64_t MomentumCheckpoints::last_written() const {
  return writer_ == nullptr ? -1 : writer_->last_written();
}

absl::Status MomentumCheckpoints::Wait() {
  return writer_ == nullptr ? absl::OkStatus() : writer_->WaitIdle();
}

absl::StatusOr<std::vector<MomentumCheckpoints::Found>>
MomentumCheckpoints::FindMissing(const std::string& dir, int64_t version,
                                 std::vector<Expert> missing, int64_t committed,
                                 int64_t* reference) {
  std::vector<Found> found;
  // The checkpoints of the job's step, when it is known: a newer one may be
  // there too, of a step staged and persisted before its vote that never
  // committed (each directory keeps its newest two).
  MUONPS_ASSIGN_OR_RETURN(const CheckpointCatalog catalog,
                          CheckpointCatalog::Load(dir, committed));
  // Nothing to say when the job has no checkpoints yet; when it is at a
  // step with none, every expert is reported missing below.
  if (catalog.empty() && committed < 0) return found;
  // A worker that has committed nothing takes the newest checkpoint's
  // step: its trainer must resume from there.
  *reference = committed >= 0 ? committed : catalog.newest_step();
  int64_t stale = 0, absent = 0;
  for (Expert& x : missing) {
    const std::string& name = x.spec.name;
    std::vector<float> values(x.spec.rows * x.spec.cols);
    const absl::StatusOr<int64_t> step = catalog.Restore(
        name, x.expert, x.spec.rows, x.spec.cols, values.data());
    Lookup lookup{*reference, committed, false, ""};
    if (!step.ok()) {
      ++absent;
      if (!absl::IsNotFound(step.status())) {
        spdlog::error(
            "worker={} plan_version={} momentum of {} expert {} not "
            "restored: {}",
            worker_id_, version, Quoted(name), x.expert,
            step.status().ToString());
        continue;
      }
      lookup.why_not = std::string(step.status().message());
    } else if (*step != *reference) {
      ++stale;
      lookup.why_not = absl::StrCat(
          "the newest checkpoint holding matrix ", Quoted(name), " expert ",
          x.expert, " is of step ", *step, "; the job is at step ", *reference);
      spdlog::warn(
          "worker={} plan_version={} momentum of {} expert {} left at zero: "
          "the newest checkpoint holding it is of step {}, the job's step "
          "here is {}",
          worker_id_, version, Quoted(name), x.expert, *step, *reference);
    } else {
      lookup.installed = true;
    }
    {
      absl::MutexLock lock(&mu_);
      lookups_[{x.matrix, x.expert}] = lookup;
    }
    if (lookup.installed) found.push_back({std::move(x), std::move(values)});
  }
  Count(0, stale, absent);
  if (stale + absent > 0) {
    spdlog::warn(
        "worker={} plan_version={} {} owned experts have no checkpoint of "
        "step {} ({} of another step, {} in none): they start from zero",
        worker_id_, version, stale + absent, *reference, stale, absent);
  }
  return found;
}

void MomentumCheckpoints::RestoredMissing(const std::string& dir,
                                          int64_t version, int64_t reference,
                                          int64_t committed, int64_t count) {
  if (count == 0) return;
  Count(count, 0, 0);
  restored_step_.store(reference);
  if (committed >= 0) {
    spdlog::info(
        "worker={} plan_version={} restored the momentum of {} owned experts "
        "as of step {} from {}",
        worker_id_, version, count, reference, dir);
    return;
  }
  spdlog::warn(
      "worker={} plan_version={} restored the momentum of {} owned "
      "experts as of step {} from {}: valid only if the trainer resumes "
      "from step {} (its next step is {})",
      worker_id_, version, count, reference, dir, reference, reference + 1);
}

absl::StatusOr<CheckedMomentum> MomentumCheckpoints::Read(
    const std::string& dir, int64_t step, int64_t version,
    const std::vector<Expert>& owned) const {
  if (dir.empty() || dir[0] != '/') {
    return InvalidField("checkpoint_dir",
                        absl::StrCat(Quoted(dir), " is not an absolute path"));
  }
  if (step < 0) return InvalidField("step", absl::StrCat(step, " < 0"));
  CheckedMomentum out;
  out.version = version;
  out.checkpoint_step = step;
  out.checkpoint_dir = dir;
  MUONPS_ASSIGN_OR_RETURN(const CheckpointCatalog catalog,
                          CheckpointCatalog::Load(dir, step));
  for (const Expert& x : owned) {
    std::vector<float> values(x.spec.rows * x.spec.cols);
    const absl::StatusOr<int64_t> found = catalog.Restore(
        x.spec.name, x.expert, x.spec.rows, x.spec.cols, values.data());
    if (!found.ok()) {
      return Annotate(found.status(), absl::StrCat("checkpoint of step ", step,
                                                   " in ", Quoted(dir)));
    }
    out.experts.push_back({x.spec.name, x.expert, std::move(values)});
  }
  return out;
}

void MomentumCheckpoints::Installed(const CheckedMomentum& checked,
                                    int64_t count) {
  const int64_t step = checked.checkpoint_step;
  {
    absl::MutexLock lock(&mu_);
    lookups_.clear();  // the slots hold this restore's step now
  }
  restored_step_.store(step);
  Count(count, 0, 0);
  spdlog::info(
      "worker={} plan_version={} momentum of {} owned experts restored from "
      "the checkpoint of step {} in {}",
      worker_id_, checked.version, count, step, checked.checkpoint_dir);
}

void MomentumCheckpoints::Dropped(int64_t count) { Count(0, count, 0); }

void MomentumCheckpoints::Adopted(int64_t committed) {
  absl::MutexLock lock(&mu_);
  for (auto& [item, lookup] : lookups_) {
    if (lookup.committed < 0) lookup.committed = committed;
  }
}

absl::StatusOr<std::optional<std::vector<float>>>
MomentumCheckpoints::ForHandover(
    std::optional<absl::StatusOr<CheckpointCatalog>>& catalog,
    const std::string& dir, const Expert& lost, int64_t step, int64_t committed,
    bool has_momentum) {
  if (dir.empty() || step < 0) {
    return absl::NotFoundError("the job keeps no checkpoints");
  }
  {
    // FindMissing already looked this item up for this step, and no step
    // was committed here since.
    absl::MutexLock lock(&mu_);
    const auto found = lookups_.find({lost.matrix, lost.expert});
    if (found != lookups_.end() && found->second.step == step &&
        found->second.committed == committed) {
      if (!found->second.installed) {
        return absl::NotFoundError(found->second.why_not);
      }
      if (has_momentum) return std::nullopt;  // the slot holds that step's
    }
  }
  // The checkpoints of that step (a newer, uncommitted one may be there).
  if (!catalog.has_value()) catalog = CheckpointCatalog::Load(dir, step);
  if (!catalog->ok()) return catalog->status();
  const scheduler::MatrixSpec& spec = lost.spec;
  std::vector<float> values(spec.rows * spec.cols);
  MUONPS_ASSIGN_OR_RETURN(const int64_t as_of,
                          (*catalog)->Restore(spec.name, lost.expert, spec.rows,
                                              spec.cols, values.data()));
  if (as_of != step) {
    Count(0, 1, 0);
    return absl::NotFoundError(absl::StrCat(
        "the newest checkpoint holding matrix ", Quoted(spec.name), " expert ",
        lost.expert, " is of step ", as_of, "; the job is at step ", step));
  }
  return values;
}

void MomentumCheckpoints::HandedOverFromCheckpoint(const Expert& lost,
                                                   int64_t step,
                                                   int64_t version) {
  Count(1, 0, 0);
  spdlog::info(
      "worker={} plan_version={} momentum of {} expert {} restored from the "
      "checkpoint of step {} (its owner left)",
      worker_id_, version, Quoted(lost.spec.name), lost.expert, step);
}

}  // namespace worker
}  // namespace muonps
