// Coordinator: the coordinator's state, as its parts, wired over one
// JobTable and one StoreQueue:
//   jobs()        JobCatalog         jobs and their specs
//   membership()  Membership         workers joining, heartbeats, leases
//   plans()       PlanPublisher      planning, plan versions, watchers
//   nccl_ids()    NcclIdExchange     the NCCL ids of a plan version
//   step_stats()  StepStatsRecorder  each worker's newest step
// Every part validates its input and returns statuses naming the field; a
// bad request never changes state. Long work (planning, store writes) runs
// outside the table's mutex: heartbeats and reads never wait on it.
//
// Durability (Open with a JobStore, muonps-coordinator --state_dir): every
// change a caller is told succeeded is fsynced first; a new plan version
// becomes visible only once it is durable, so no one ever sees a version a
// restart could take back. Plan versions never go backwards: a restart
// continues from the stored ones, and a job created under the name of a
// deleted one continues above the deleted one's last version (in memory as
// well). Leases are not stored: Open gives every member a fresh one.
//
// Takes and returns the coordinator's own types only: muonps.v1 messages
// are converted at the service edge (coordinator_wire.h). Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_COORDINATOR_H_
#define MUONPS_SERVER_COORDINATOR_COORDINATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "server/coordinator/coordinator_options.h"
#include "server/coordinator/job_catalog.h"
#include "server/coordinator/job_store.h"
#include "server/coordinator/job_table.h"
#include "server/coordinator/membership.h"
#include "server/coordinator/nccl_id_exchange.h"
#include "server/coordinator/plan_publisher.h"
#include "server/coordinator/step_stats_recorder.h"
#include "server/coordinator/store_queue.h"

namespace muonps {
namespace coordinator {

class Coordinator {
 public:
  // A coordinator whose state lives in memory only.
  explicit Coordinator(
      const CoordinatorOptions& options,
      Clock clock = [] { return absl::Now(); });
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // A durable coordinator over `store`: loads its jobs, members (each with
  // a fresh lease), latest plans and NCCL ids, and re-plans every job whose
  // stored plan is not of its stored members (a crash between the two
  // writes). Errors of the store's Load (DATA_LOSS naming the row), of the
  // restore (DATA_LOSS naming the job) or of a re-plan's write.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Open(
      const CoordinatorOptions& options, std::unique_ptr<JobStore> store,
      Clock clock = [] { return absl::Now(); });

  JobCatalog& jobs() { return jobs_; }
  Membership& membership() { return membership_; }
  PlanPublisher& plans() { return plans_; }
  NcclIdExchange& nccl_ids() { return nccl_ids_; }
  StepStatsRecorder& step_stats() { return step_stats_; }

  // Told of every store commit (wall time, op count). Set once, before
  // serving.
  void set_store_write_observer(StoreQueue::WriteObserver observer) {
    queue_.set_write_observer(std::move(observer));
  }
  // OK, or the store write that failed. A failure sticks: every later
  // change is UNAVAILABLE, since memory no longer matches the disk; the
  // process should exit so that a restart reloads the durable state.
  absl::Status store_status() { return queue_.status(); }

 private:
  Coordinator(const CoordinatorOptions& options, Clock clock,
              std::unique_ptr<JobStore> store);

  const CoordinatorOptions options_;
  const Clock clock_;
  JobTable table_;
  StoreQueue queue_;
  PlanPublisher plans_;
  JobCatalog jobs_;
  Membership membership_;
  NcclIdExchange nccl_ids_;
  StepStatsRecorder step_stats_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_COORDINATOR_H_
