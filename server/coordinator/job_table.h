// JobTable: the coordinator's jobs by name and the one mutex that guards
// them. Each job is a JobRecord whose parts belong to the coordinator's
// parts: the job itself to JobCatalog, its members to Membership (and
// their step stats to StepStatsRecorder), its plan versions to
// PlanPublisher (and their NCCL ids to NcclIdExchange). Every part takes
// mutex() for what it reads or changes, briefly: nothing slow (no planning,
// no store write) runs under it. The table also remembers the last plan
// version of every deleted job name, so that a job created again under it
// continues above it.
//
// Thread-safe through mutex(): every method but mutex() requires it held.
#ifndef MUONPS_SERVER_COORDINATOR_JOB_TABLE_H_
#define MUONPS_SERVER_COORDINATOR_JOB_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/plan_types.h"
#include "server/coordinator/job_members.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/plan_history.h"

namespace muonps {
namespace coordinator {

struct JobRecord {
  // JobCatalog's: the job as created.
  std::shared_ptr<const JobSpec> spec;
  // spec->matrices, shared on their own with plans and planners.
  std::shared_ptr<const std::vector<scheduler::MatrixSpec>> matrices;
  std::string create_request_id;
  absl::Time create_time;
  // Handed out by CreateJob (DeleteJob requires it).
  std::string job_token;
  // Handed out by JoinJob (the data plane's handshake key).
  std::string data_plane_secret;
  // Tells a job from an earlier one of the same name (set by Insert).
  uint64_t incarnation = 0;

  // Membership's: the workers and their leases.
  JobMembers members;
  // PlanPublisher's: the plan versions.
  PlanHistory plans;

  // StepStatsRecorder's: a worker reported a step (or the job was restored
  // with a plan), so momentum may exist and a re-plan keeps owners where it
  // can (scheduler::Replan). Before that, a re-plan for workers that only
  // joined is fresh (scheduler::PlanAfresh): the workers of a job's
  // start-up join one at a time, and keeping the owners of each earlier
  // version would leave the join order's imbalance for the whole run. A
  // lost worker's re-plan keeps the survivors' owners either way.
  bool stepped = false;
  // StepStatsRecorder's: re-plans by its ranks' measured speeds.
  SpeedBalance speed_balance;
};

class JobTable {
 public:
  JobTable() = default;
  JobTable(const JobTable&) = delete;
  JobTable& operator=(const JobTable&) = delete;

  absl::Mutex* mutex() ABSL_LOCK_RETURNED(mu_) { return &mu_; }

  // Job `name`: INVALID_ARGUMENT naming `job` for a malformed name,
  // NOT_FOUND naming `job` when there is none.
  absl::StatusOr<JobRecord*> Find(const std::string& name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job `name` if it is still the one of `incarnation`, else null.
  JobRecord* FindIncarnation(const std::string& name, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every job, by name.
  std::map<std::string, JobRecord>& jobs() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return jobs_;
  }

  // Adds `record` as job `name` (there must be none) with a new
  // incarnation, its plan versions continuing above the name's floor.
  JobRecord& Insert(const std::string& name, JobRecord record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes job `name` (it must exist), raising the name's floor to its
  // latest version; returns the floor and hands the record back, for the
  // caller to free outside the mutex (big jobs' records are megabytes).
  int64_t Remove(const std::string& name, JobRecord* removed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The floors as a store holds them (Restore).
  void set_version_floors(std::map<std::string, int64_t> floors)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    version_floors_ = std::move(floors);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  // Last version of every deleted job name (see JobStore).
  std::map<std::string, int64_t> version_floors_ ABSL_GUARDED_BY(mu_);
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_JOB_TABLE_H_
