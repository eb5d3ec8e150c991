#include "server/worker/checkpoint_writer.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "server/worker/checkpoint_store.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// mkdir that accepts an existing directory.
absl::Status MakeDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0750) == 0 || errno == EEXIST) {
    return absl::OkStatus();
  }
  return absl::InternalError(
      absl::StrCat("mkdir ", Quoted(path), ": ", std::strerror(errno)));
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string worker_id,
                                   MetricsRegistry* metrics)
    : worker_id_(std::move(worker_id)),
      results_(metrics == nullptr
                   ? nullptr
                   : metrics->AddCounter(
                         "muonps_worker_checkpoints_total",
                         "Momentum checkpoints by result: written, failed; "
                         "delayed: submitted while the previous one was "
                         "still being written, and waited for it.",
                         {"result"})),
      thread_([this] { Loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

absl::Duration CheckpointWriter::Submit(CheckpointSnapshot snapshot) {
  const int64_t step = snapshot.step;
  const absl::Time start = absl::Now();
  bool waited = false;
  {
    absl::MutexLock lock(&mu_);
    waited = busy_;
    mu_.Await(absl::Condition(
        +[](bool* busy) { return !*busy; }, &busy_));
    busy_ = true;
    pending_ = std::move(snapshot);
  }
  const absl::Duration wait = absl::Now() - start;
  if (waited) {
    spdlog::warn(
        "worker={} step={} checkpoint waited {:.1f} ms for the previous one "
        "to be written",
        worker_id_, step, absl::ToDoubleMilliseconds(wait));
    if (results_ != nullptr) results_->Increment({"delayed"});
  }
  return waited ? wait : absl::ZeroDuration();
}

absl::Status CheckpointWriter::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* busy) { return !*busy; }, &busy_));
  return last_status_;
}

void CheckpointWriter::Loop() {
  for (;;) {
    CheckpointSnapshot snapshot;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](CheckpointWriter* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return w->stop_ || w->pending_.has_value();
          },
          this));
      if (!pending_.has_value()) return;  // stopped, nothing left
      snapshot = std::move(*pending_);
      pending_.reset();
    }
    const absl::Time start = absl::Now();
    const absl::Status written = Write(snapshot);
    if (written.ok()) {
      last_written_.store(snapshot.step);
      spdlog::info(
          "worker={} step={} plan_version={} checkpoint written: {} tensors "
          "in {:.1f} ms",
          worker_id_, snapshot.step, snapshot.plan_version,
          snapshot.tensors.size(),
          absl::ToDoubleMilliseconds(absl::Now() - start));
    } else {
      spdlog::error("worker={} step={} checkpoint failed: {}", worker_id_,
                    snapshot.step, written.ToString());
    }
    if (results_ != nullptr) {
      results_->Increment({written.ok() ? "written" : "failed"});
    }
    absl::MutexLock lock(&mu_);
    last_status_ = written;
    busy_ = false;
  }
}

absl::Status CheckpointWriter::Write(const CheckpointSnapshot& snapshot) {
  // Worker ids are [A-Za-z0-9._-]: "." and ".." would name no directory of
  // its own.
  if (worker_id_.empty() || worker_id_ == "." || worker_id_ == "..") {
    return InvalidField("worker_id",
                        absl::StrCat(Quoted(worker_id_),
                                     " cannot name a checkpoint directory"));
  }
  MUONPS_RETURN_IF_ERROR(MakeDirectory(snapshot.checkpoint_dir));
  const std::string dir =
      absl::StrCat(snapshot.checkpoint_dir, "/", worker_id_);
  MUONPS_RETURN_IF_ERROR(MakeDirectory(dir));
  // A step written before a vote that did not commit, written again by its
  // redo (MomentumCheckpoints::Write).
  MUONPS_RETURN_IF_ERROR(RemoveCheckpoint(dir, snapshot.step));
  std::vector<CheckpointTensorValues> tensors;
  tensors.reserve(snapshot.tensors.size());
  for (const SnapshotTensor& t : snapshot.tensors) {
    tensors.push_back({t.name, t.expert, t.rows, t.cols, t.values});
  }
  return WriteCheckpoint(dir, snapshot.step, snapshot.plan_version, worker_id_,
                         tensors)
      .status();
}

}  // namespace worker
}  // namespace muonps
