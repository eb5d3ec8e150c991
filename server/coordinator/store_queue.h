// StoreQueue: the coordinator's changes on their way to its JobStore, in
// the order they were made, written outside the coordinator's mutex
// (LevelDB's rule: long work outside the lock).
//
// A part queues the store ops of a change while it holds the JobTable's
// mutex, so the queue's order is the order of the changes, and then, with
// that mutex released, waits in Persist until the change is durable. One
// writer at a time commits everything queued so far in one transaction
// (fsynced), so later writers find earlier changes already durable (group
// commit). The ops of one Enqueue are never split between transactions.
// Without a store every change is durable at once.
//
// A failed write sticks: memory no longer matches the disk, so every later
// Persist is UNAVAILABLE and the process should exit (a restart reloads
// the durable state).
//
// Thread-safe. Lock order: the JobTable's mutex, then the queue's; the
// writer's, then the queue's. Persist never takes the JobTable's mutex.
#ifndef MUONPS_SERVER_COORDINATOR_STORE_QUEUE_H_
#define MUONPS_SERVER_COORDINATOR_STORE_QUEUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/coordinator/job_store.h"

namespace muonps {
namespace coordinator {

class StoreQueue {
 public:
  // Told after every commit of its wall time (fsync included) and op count.
  using WriteObserver = std::function<void(double seconds, size_t ops)>;

  // Writes to `store`; a null store keeps nothing (memory only).
  explicit StoreQueue(std::unique_ptr<JobStore> store);
  StoreQueue(const StoreQueue&) = delete;
  StoreQueue& operator=(const StoreQueue&) = delete;

  // The store, or null (memory only).
  JobStore* store() { return store_.get(); }

  // Set once, before any change.
  void set_write_observer(WriteObserver observer) {
    observer_ = std::move(observer);
  }

  // Queues `ops` (nothing without a store) and returns the sequence number
  // to Persist. Called with the JobTable's mutex held, in change order.
  int64_t Enqueue(std::vector<StoreOp> ops) ABSL_LOCKS_EXCLUDED(queue_mu_);
  // The sequence number of the newest change queued: Persist(it) makes
  // every change made so far durable (a retry waits so for its original).
  int64_t last_enqueued() ABSL_LOCKS_EXCLUDED(queue_mu_);

  // Returns once every change queued up to `seq` is durable, committing
  // the queue or waiting for the writer that does. UNAVAILABLE when this
  // commit or an earlier one failed. Never call with the JobTable's mutex.
  absl::Status Persist(int64_t seq) ABSL_LOCKS_EXCLUDED(writer_mu_, queue_mu_);

  // OK, or the store write that failed (for the process to exit on).
  absl::Status status() ABSL_LOCKS_EXCLUDED(writer_mu_);

 private:
  const std::unique_ptr<JobStore> store_;
  WriteObserver observer_;

  absl::Mutex writer_mu_;
  int64_t durable_seq_ ABSL_GUARDED_BY(writer_mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(writer_mu_);

  absl::Mutex queue_mu_ ABSL_ACQUIRED_AFTER(writer_mu_);
  std::vector<StoreOp> pending_ ABSL_GUARDED_BY(queue_mu_);
  int64_t enqueued_seq_ ABSL_GUARDED_BY(queue_mu_) = 0;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_STORE_QUEUE_H_
