// StepEngine's calls into its MomentumStore that use the device, ordered
// with the steps (the store's device rule: under the engine's lock), and
// what a momentum write does to a step staged in doubt. Checks and disk
// reads happen before the lock; checkpoints are written after it
// (step_engine.cc).
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "server/worker/step_engine.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

absl::StatusOr<std::vector<float>> StepEngine::Momentum(
    const std::string& matrix, int64_t expert) const {
  absl::MutexLock lock(&mu_);
  return momentum_.Get(matrix, expert);
}

absl::Status StepEngine::SetMomentum(const std::string& matrix, int64_t expert,
                                     std::vector<float> values) {
  MUONPS_ASSIGN_OR_RETURN(CheckedMomentum checked,
                          momentum_.Check(matrix, expert, std::move(values)));
  absl::MutexLock lock(&mu_);
  const int64_t staged = ledger_.staged.step_id;
  MUONPS_RETURN_IF_ERROR(
      momentum_.Write(std::move(checked), ledger_.last.load()).status());
  ForgetStaged(staged, "momentum is being restored");
  return absl::OkStatus();
}

absl::Status StepEngine::RestoreMissingMomentum() {
  absl::MutexLock lock(&mu_);
  return momentum_.RestoreMissing(ledger_.last.load());
}

absl::StatusOr<int64_t> StepEngine::RestoreCheckpoint(const std::string& dir,
                                                      int64_t step) {
  MUONPS_ASSIGN_OR_RETURN(CheckedMomentum read,
                          momentum_.ReadCheckpoint(dir, step));
  absl::MutexLock lock(&mu_);
  const int64_t staged = ledger_.staged.step_id;
  MUONPS_ASSIGN_OR_RETURN(
      const int64_t restored,
      momentum_.Write(std::move(read), ledger_.last.load()));
  ForgetStaged(staged, "momentum is being restored from a checkpoint");
  return restored;
}

void StepEngine::ForgetStaged(int64_t staged, const char* why) {
  if (staged < 0) return;
  // The store dropped its new momentum with the write; its updates go too.
  spdlog::warn("worker={} step={} staged in doubt: dropped, {}", worker_id_,
               staged, why);
  DropStaged(ledger_, plan_);
}

}  // namespace worker
}  // namespace muonps
