// PlanPublisher: the plan versions of every job, made and handed out. After
// a change of a job's members, PlanAtLeast plans the job from a copy
// outside the JobTable's mutex (one planner per job at a time; the others
// wait for what it publishes), makes the plan durable, and publishes it
// under the mutex only if the members it was computed from are still
// current, else plans again. So a heartbeat or a GetPlan never waits on a
// planner or on the store, and no one ever sees a version a restart could
// take back. GetPlan answers a kept version; WaitForPlan lets a watcher
// (WatchPlan) wait for the next.
//
// Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_PLAN_PUBLISHER_H_
#define MUONPS_SERVER_COORDINATOR_PLAN_PUBLISHER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/step_clock.h"
#include "server/coordinator/job_table.h"
#include "server/coordinator/published_plan.h"
#include "server/coordinator/store_queue.h"

namespace muonps {
namespace coordinator {

class PlanPublisher {
 public:
  // `table` and `queue` must outlive the publisher; each job keeps its
  // newest `plan_history` versions for GetPlan; plans weigh `links`.
  PlanPublisher(JobTable* table, StoreQueue* queue, int plan_history,
                const scheduler::LinkFigures& links = {});
  PlanPublisher(const PlanPublisher&) = delete;
  PlanPublisher& operator=(const PlanPublisher&) = delete;

  // Plans job `name` (of `incarnation`) until its published plan (or its
  // plan error) reflects membership generation `generation` or later, and
  // returns its latest version then. A planner's error (e.g. workers too
  // small for the matrices) is not a failure: it becomes the job's plan
  // error, which GetPlan reports. NOT_FOUND naming job if the job is
  // deleted meanwhile; UNAVAILABLE if the store fails. Slow: never call
  // with the JobTable's mutex held.
  absl::StatusOr<int64_t> PlanAtLeast(const std::string& name,
                                      uint64_t incarnation, int64_t generation);

  // Version `version` of job `job`'s plan, 0 for the current one.
  // INVALID_ARGUMENT naming version when it is negative; NOT_FOUND naming
  // job or version (pruned, or not made yet); FAILED_PRECONDITION naming job
  // when the job has no current plan, saying why (no workers, or the
  // planner's error). The plan is shared, not copied.
  absl::StatusOr<std::shared_ptr<const PublishedPlan>> GetPlan(
      const std::string& job, int64_t version);

  // Waits up to `timeout` for a current plan of `job` whose version is not
  // `known_version` (above it, or the current one at once when
  // `known_version` is above anything the job published: the caller's plan
  // is from before a restart or from a deleted job of the same name).
  // Returns the plan, or null on timeout; NOT_FOUND naming job if the job
  // does not exist or is deleted while waiting.
  absl::StatusOr<std::shared_ptr<const PublishedPlan>> WaitForPlan(
      const std::string& job, int64_t known_version, absl::Duration timeout);

  // Wakes every watcher and waiting planner (after a job is deleted). May
  // be called with or without the JobTable's mutex.
  void WakeWatchers() { plan_changed_.SignalAll(); }

  // Plan versions published since the start, over all jobs.
  int64_t published_versions() const { return published_versions_.load(); }

 private:
  JobTable* const table_;
  StoreQueue* const queue_;
  const int plan_history_;
  const scheduler::LinkFigures links_;
  // Signalled under the table's mutex whenever a plan, a plan error or a
  // planner's state changes, and when a job is deleted.
  absl::CondVar plan_changed_;
  std::atomic<int64_t> published_versions_{0};
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_PLAN_PUBLISHER_H_
