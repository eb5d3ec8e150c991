#include "server/coordinator/store_queue.h"

#include <chrono>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {

StoreQueue::StoreQueue(std::unique_ptr<JobStore> store)
    : store_(std::move(store)) {}

int64_t StoreQueue::Enqueue(std::vector<StoreOp> ops) {
  if (store_ == nullptr) return 0;
  absl::MutexLock lock(&queue_mu_);
  if (!ops.empty()) {
    pending_.insert(pending_.end(), std::make_move_iterator(ops.begin()),
                    std::make_move_iterator(ops.end()));
    ++enqueued_seq_;
  }
  return enqueued_seq_;
}

int64_t StoreQueue::last_enqueued() {
  absl::MutexLock lock(&queue_mu_);
  return enqueued_seq_;
}

absl::Status StoreQueue::Persist(int64_t seq) {
  if (store_ == nullptr) return absl::OkStatus();
  absl::MutexLock writer(&writer_mu_);
  if (!failure_.ok()) {
    return absl::UnavailableError(
        absl::StrCat("the coordinator's state store failed earlier (",
                     failure_.message(), "); it must restart"));
  }
  if (durable_seq_ >= seq) return absl::OkStatus();  // a group commit did
  std::vector<StoreOp> batch;
  int64_t last = 0;
  {
    absl::MutexLock lock(&queue_mu_);
    batch.swap(pending_);
    last = enqueued_seq_;
  }
  const auto start = std::chrono::steady_clock::now();
  const absl::Status applied = store_->Apply(batch);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (observer_) observer_(seconds, batch.size());
  if (!applied.ok()) {
    failure_ = applied;
    spdlog::critical("state store write failed, memory and disk differ: {}",
                     applied.ToString());
    return absl::UnavailableError(
        absl::StrCat("the change is not durable: ", applied.message()));
  }
  durable_seq_ = last;
  return absl::OkStatus();
}

absl::Status StoreQueue::status() {
  absl::MutexLock lock(&writer_mu_);
  return failure_;
}

}  // namespace coordinator
}  // namespace muonps
