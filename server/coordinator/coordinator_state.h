// The coordinator's state: jobs, worker leases, plan versions and NCCL ids,
// behind one mutex. Every change of a job's workers (join, leave, expired
// lease) re-plans that job through the scheduler (stably, from the previous
// plan) and publishes a new plan version to watchers.
//
// Methods validate their input and return statuses naming the field; a bad
// request never changes state. Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_COORDINATOR_STATE_H_
#define MUONPS_SERVER_COORDINATOR_COORDINATOR_STATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "muonps/v1/coordinator.pb.h"
#include "scheduler/cost_table.h"
#include "scheduler/plan_types.h"
#include "server/coordinator/request_validation.h"

namespace muonps {
namespace coordinator {

struct CoordinatorOptions {
  Limits limits;
  absl::Duration lease_ttl = absl::Seconds(6);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Plan versions kept per job for GetPlan.
  int plan_history = 16;
};

// Counts for metrics.
struct StateCounts {
  int64_t jobs = 0;
  int64_t workers = 0;
  int64_t plan_versions = 0;  // published, summed over jobs
};

class CoordinatorState {
 public:
  using Clock = std::function<absl::Time()>;

  explicit CoordinatorState(
      const CoordinatorOptions& options,
      Clock clock = [] { return absl::Now(); });
  CoordinatorState(const CoordinatorState&) = delete;
  CoordinatorState& operator=(const CoordinatorState&) = delete;

  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& job);
  v1::ListJobsResponse ListJobs();
  // UNAUTHENTICATED unless `r.job_token` is the one CreateJob returned.
  absl::Status DeleteJob(const v1::DeleteJobRequest& r);

  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& r);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& r);
  absl::Status LeaveJob(const v1::LeaveJobRequest& r);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
      const v1::ListWorkersRequest& r);

  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& r);
  // Waits up to `timeout` for a plan version above `known_version`: the
  // plan, nullopt on timeout, NOT_FOUND if the job does not exist (or is
  // deleted while waiting).
  absl::StatusOr<std::optional<v1::Plan>> WaitForPlan(const std::string& job,
                                                      int64_t known_version,
                                                      absl::Duration timeout);

  absl::Status PutNcclId(const v1::PutNcclIdRequest& r);
  absl::StatusOr<v1::GetNcclIdResponse> GetNcclId(
      const v1::GetNcclIdRequest& r);
  absl::Status ReportStepStats(const v1::ReportStepStatsRequest& r);

  // Drops every worker whose lease has expired and re-plans their jobs.
  // Returns "job/worker" for each dropped worker.
  std::vector<std::string> ExpireLeases();

  StateCounts Counts();

 private:
  struct WorkerRecord {
    v1::JoinJobRequest join;
    std::shared_ptr<const scheduler::CostTable> costs;
    absl::Time join_time;
    absl::Time lease_expiry;
    int64_t reported_version = 0;
    // The credential JoinJob handed out; the worker's other calls carry it.
    std::string token;
  };
  struct PlanRecord {
    v1::Plan proto;
    scheduler::OwnershipPlan plan;
    std::string nccl_id;
    int64_t nccl_generation = 0;
  };
  struct JobRecord {
    v1::JobSpec spec;
    std::string create_request_id;
    absl::Time create_time;
    // Handed out by CreateJob (DeleteJob requires it) and by JoinJob (the
    // data plane's handshake key).
    std::string job_token;
    std::string data_plane_secret;
    std::vector<scheduler::MatrixSpec> matrices;
    std::map<std::string, WorkerRecord> workers;
    std::vector<std::string> join_order;
    std::deque<PlanRecord> plans;  // oldest first
    int64_t latest_version = 0;
    // Why the current worker set has no plan ("" when it has one).
    std::string plan_error;
  };

  absl::StatusOr<JobRecord*> FindJob(const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::Job JobToProto(const std::string& name, const JobRecord& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-plans `job` for its current workers and publishes a new version.
  void Replan(const std::string& name, JobRecord* job,
              const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWorker(JobRecord* job, const std::string& worker_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker_id`'s record in `job` if `worker_token` is the token JoinJob gave
  // it: NOT_FOUND naming worker_id when it holds no lease, UNAUTHENTICATED
  // naming worker_token otherwise.
  absl::StatusOr<WorkerRecord*> AuthenticateWorker(
      const std::string& job_name, JobRecord* job, const std::string& worker_id,
      const std::string& worker_token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CoordinatorOptions options_;
  const Clock clock_;
  absl::Mutex mu_;
  absl::CondVar plan_changed_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t published_versions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_COORDINATOR_STATE_H_
