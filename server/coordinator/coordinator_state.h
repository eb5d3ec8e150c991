// The coordinator's state: jobs, worker leases, plan versions and NCCL ids.
// Every change of a job's workers (join, leave, expired lease) re-plans that
// job through the scheduler (stably, from the previous plan) and publishes a
// new plan version to watchers.
//
// Locking (LevelDB's rule: long work outside the lock). One mutex guards
// the maps; nothing slow runs under it. A membership change bumps the job's
// membership generation under the mutex; the caller then plans from a copy
// of the membership outside it (one planner per job at a time) and
// publishes under it only if the generation it planned from is still
// current, else plans again. Store writes, when there is a store, also run
// outside the mutex, one writer at a time and in the order the changes were
// made (later writers commit earlier changes with theirs). So Heartbeat,
// GetPlan, ListWorkers and the like never wait on a plan or an fsync.
//
// Durability (Open with a JobStore, muonps-coordinator --state_dir): every
// change a caller is told succeeded is fsynced first; a new plan version
// becomes visible only once it is durable, so no one ever sees a version a
// restart could take back. Plan versions never go backwards: a restart
// continues from the stored ones, and a job created under the name of a
// deleted one continues above the deleted one's last version (in memory as
// well). Leases are not stored: Open gives every member a fresh one.
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
#include "server/coordinator/job_store.h"
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
  // Called after every store commit with its wall time and op count.
  using StoreWriteObserver = std::function<void(double seconds, size_t ops)>;

  // A coordinator whose state lives in memory only.
  explicit CoordinatorState(
      const CoordinatorOptions& options,
      Clock clock = [] { return absl::Now(); });
  CoordinatorState(const CoordinatorState&) = delete;
  CoordinatorState& operator=(const CoordinatorState&) = delete;

  // A durable coordinator over `store`: loads its jobs, members (each with
  // a fresh lease), latest plans and NCCL ids, and re-plans every job whose
  // stored plan is not of its stored members (a crash between the two
  // writes). Errors of the store's Load (DATA_LOSS naming the row) or of a
  // re-plan's write.
  static absl::StatusOr<std::unique_ptr<CoordinatorState>> Open(
      const CoordinatorOptions& options, std::unique_ptr<JobStore> store,
      Clock clock = [] { return absl::Now(); });

  // Set once, before serving.
  void set_store_write_observer(StoreWriteObserver observer) {
    store_write_observer_ = std::move(observer);
  }
  // OK, or the store write that failed. A failure sticks: every later
  // change is UNAVAILABLE, since memory no longer matches the disk; the
  // process should exit so that a restart reloads the durable state.
  absl::Status store_status() ABSL_LOCKS_EXCLUDED(store_mu_);

  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& job);
  v1::ListJobsResponse ListJobs();
  // UNAUTHENTICATED unless `r.job_token` is the one CreateJob returned.
  absl::Status DeleteJob(const v1::DeleteJobRequest& r);

  // Returns once the plan that includes the worker is published (or the
  // planner said why none can be, see GetPlan).
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& r);
  // Never waits on planning or the store. FAILED_PRECONDITION naming
  // plan_version when it is above the job's latest: the worker follows a
  // plan this coordinator never published and must join again.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& r);
  absl::Status LeaveJob(const v1::LeaveJobRequest& r);
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
      const v1::ListWorkersRequest& r);

  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& r);
  // Waits up to `timeout` for a plan version other than `known_version`
  // (above it, or the current one at once when `known_version` is above
  // anything this job published: the caller's plan is from before a
  // restart or from a deleted job of the same name): the plan, nullopt on
  // timeout, NOT_FOUND if the job does not exist (or is deleted while
  // waiting).
  absl::StatusOr<std::optional<v1::Plan>> WaitForPlan(const std::string& job,
                                                      int64_t known_version,
                                                      absl::Duration timeout);

  absl::Status PutNcclId(const v1::PutNcclIdRequest& r);
  absl::StatusOr<v1::GetNcclIdResponse> GetNcclId(
      const v1::GetNcclIdRequest& r);
  // Keeps the report in the worker's record when its step id is above the
  // one held there (an older or repeated step id changes nothing, and is
  // still OK); ListWorkers shows it as WorkerInfo.last_step. In memory only:
  // it goes with the record when the worker leaves, its lease expires or a
  // new instance takes its id over. INVALID_ARGUMENT naming the field (a
  // negative or non-finite number, a plan_version above the job's latest),
  // NOT_FOUND (job or worker), UNAUTHENTICATED (worker_token).
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
    int64_t join_seq = 0;
    // The job's membership generation its join made.
    int64_t generation = 0;
    // The newest step it reported (highest step id); nullopt until one.
    std::optional<v1::WorkerStepStats> last_step;
  };
  struct PlanRecord {
    std::shared_ptr<const v1::Plan> proto;
    std::shared_ptr<const scheduler::OwnershipPlan> plan;
    std::string nccl_id;
    int64_t nccl_generation = 0;
  };
  struct JobRecord {
    std::shared_ptr<const v1::JobSpec> spec;
    std::string create_request_id;
    absl::Time create_time;
    // Handed out by CreateJob (DeleteJob requires it) and by JoinJob (the
    // data plane's handshake key).
    std::string job_token;
    std::string data_plane_secret;
    std::shared_ptr<const std::vector<scheduler::MatrixSpec>> matrices;
    std::map<std::string, WorkerRecord> workers;
    std::vector<std::string> join_order;
    int64_t next_join_seq = 1;
    std::deque<PlanRecord> plans;  // oldest first
    int64_t latest_version = 0;
    // Why the current worker set has no plan ("" when it has one).
    std::string plan_error;
    // Tells a job from an earlier one of the same name.
    uint64_t incarnation = 0;
    // Bumped by every change of `workers`; `planned_generation` is the one
    // `plans.back()` / `plan_error` describe.
    int64_t membership_generation = 0;
    int64_t planned_generation = 0;
    // Why the workers changed since the last plan (its `reason`).
    std::vector<std::string> pending_reasons;
    // A thread is planning this job outside the mutex.
    bool planning = false;
    // A worker reported a step (ReportStepStats), or the job was restored
    // with a plan: momentum may exist, so a re-plan keeps owners where it
    // can (scheduler::Replan). Before that, a re-plan for workers that only
    // joined is fresh (scheduler::PlanAfresh): the workers of a job's
    // start-up join one at a time, and keeping the owners of each earlier
    // version would leave the join order's imbalance for the whole run. A
    // lost worker's re-plan keeps the survivors' owners either way.
    bool stepped = false;
  };
  // What a plan is computed from, copied under the mutex.
  struct PlanSnapshot {
    std::string job;
    // The version the plan will have (only the job's planner publishes).
    int64_t version = 0;
    std::shared_ptr<const std::vector<scheduler::MatrixSpec>> matrices;
    std::vector<scheduler::WorkerSpec> workers;
    int32_t dedicated = 0;
    int ns_steps = 5;
    scheduler::AlgorithmPolicy algorithm = scheduler::AlgorithmPolicy::kAuto;
    int64_t bucket_bytes = 0;
    std::shared_ptr<const scheduler::OwnershipPlan> previous;
    // Re-plan from `previous` keeping owners (see JobRecord::stepped), or
    // afresh with moved bytes counted against it.
    bool keep_owners = false;
    std::string reason;
  };
  struct PlanOutcome {
    absl::Status status;
    std::shared_ptr<scheduler::OwnershipPlan> plan;
    std::shared_ptr<v1::Plan> proto;
  };

  absl::StatusOr<JobRecord*> FindJob(const std::string& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job without its spec (callers copy that outside the mutex).
  v1::Job JobToProto(const std::string& name, const JobRecord& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job `name` if it is still the one of `incarnation`, else nullptr.
  JobRecord* FindIncarnation(const std::string& name, uint64_t incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PlanSnapshot SnapshotForPlanning(const std::string& name,
                                   const JobRecord& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the planner and the step schedule: slow, lock-free.
  static PlanOutcome ComputePlan(const PlanSnapshot& snapshot);
  // Plans job `name` (of `incarnation`) until its published plan (or
  // plan_error) reflects membership generation `generation` or later, and
  // returns its latest version then. NOT_FOUND if the job is deleted
  // meanwhile; UNAVAILABLE if the store fails.
  absl::StatusOr<int64_t> PlanAtLeast(const std::string& name,
                                      uint64_t incarnation, int64_t generation)
      ABSL_LOCKS_EXCLUDED(mu_, store_mu_);
  void AddWorker(const std::string& name, JobRecord* job, WorkerRecord worker)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `reason` ("" for none) becomes part of the next plan's.
  void RemoveWorker(const std::string& name, JobRecord* job,
                    const std::string& worker_id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker_id`'s record in `job` if `worker_token` is the token JoinJob gave
  // it: NOT_FOUND naming worker_id when it holds no lease, UNAUTHENTICATED
  // naming worker_token otherwise.
  absl::StatusOr<WorkerRecord*> AuthenticateWorker(
      const std::string& job_name, JobRecord* job, const std::string& worker_id,
      const std::string& worker_token) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FindJob(job_name) when `worker_id` authenticates in it
  // (AuthenticateWorker); the first of their errors otherwise.
  absl::StatusOr<JobRecord*> FindJobOfWorker(const std::string& job_name,
                                             const std::string& worker_id,
                                             const std::string& worker_token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AuthenticateWorker, and the lease must be held by `instance_id` (the
  // process that joined): FAILED_PRECONDITION naming instance_id otherwise.
  absl::StatusOr<WorkerRecord*> AuthenticateLease(
      const std::string& job_name, JobRecord* job, const std::string& worker_id,
      const std::string& worker_token, const std::string& instance_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a store write (nothing without a store) and returns its sequence
  // number for Persist.
  int64_t Enqueue(StoreOp op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Returns once every write queued up to `seq` is durable (committing the
  // queue, or waiting for the writer that does).
  absl::Status Persist(int64_t seq) ABSL_LOCKS_EXCLUDED(mu_, store_mu_);
  // Loads the store's state (Open's work).
  absl::Status Restore(const StoredState& stored);

  const CoordinatorOptions options_;
  const Clock clock_;
  std::unique_ptr<JobStore> store_;
  StoreWriteObserver store_write_observer_;

  // One store writer at a time; taken before mu_, never while holding it.
  absl::Mutex store_mu_;
  int64_t durable_seq_ ABSL_GUARDED_BY(store_mu_) = 0;
  absl::Status store_failure_ ABSL_GUARDED_BY(store_mu_);

  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(store_mu_);
  absl::CondVar plan_changed_;
  std::map<std::string, JobRecord> jobs_ ABSL_GUARDED_BY(mu_);
  // Last version of every deleted job name (see JobStore).
  std::map<std::string, int64_t> version_floors_ ABSL_GUARDED_BY(mu_);
  int64_t published_versions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<StoreOp> pending_writes_ ABSL_GUARDED_BY(mu_);
  int64_t enqueued_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_COORDINATOR_STATE_H_
