// Membership: workers joining jobs, renewing their leases by heartbeat,
// leaving, and losing their lease when the heartbeats stop. Every change of
// a job's workers is made durable and then re-plans the job
// (PlanPublisher::PlanAtLeast) before the caller is answered, so a joined
// worker's answer names a plan version that includes it. Heartbeat and
// ListWorkers take the JobTable's mutex only briefly: they never wait on a
// planner or the store.
//
// A bad request never changes state. Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_MEMBERSHIP_H_
#define MUONPS_SERVER_COORDINATOR_MEMBERSHIP_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/coordinator/coordinator_options.h"
#include "server/coordinator/job_table.h"
#include "server/coordinator/plan_publisher.h"
#include "server/coordinator/store_queue.h"
#include "server/coordinator/worker_types.h"

namespace muonps {
namespace coordinator {

// What a joined worker is told.
struct JoinGrant {
  absl::Duration lease_ttl;
  absl::Duration heartbeat_interval;
  // The job's latest plan version once the plan of this join is made.
  int64_t plan_version = 0;
  // The worker's credential for its other calls.
  std::string worker_token;
  std::string data_plane_secret;
};

struct HeartbeatRequest {
  std::string job;
  std::string worker_id;
  std::string instance_id;
  // The plan version the worker follows.
  int64_t plan_version = 0;
  std::string worker_token;
  std::string certificate;  // the call's (JoinRequest::certificate)
  // A trainer is attached to the worker, or asked to attach lately.
  bool has_trainer = false;
  // That trainer's rank; nullopt while none is known.
  std::optional<int32_t> trainer_rank;
};

struct HeartbeatReply {
  absl::Duration lease_ttl;
  int64_t plan_version = 0;  // the job's latest
  // The worker is draining (LeaveJob with drain).
  bool draining = false;
};

struct LeaveRequest {
  std::string job;
  std::string worker_id;
  std::string instance_id;
  std::string worker_token;
  // Drain: stay a member that owns nothing until leaving without drain.
  bool drain = false;
  std::string certificate;  // the call's (JoinRequest::certificate)
};

// An operator's drain of a member (DrainWorker).
struct DrainRequest {
  std::string job;
  std::string worker_id;
};

// A member as ListWorkers shows it.
struct WorkerView {
  std::string job;
  std::string worker_id;
  WorkerDevice device;
  std::string data_address;
  absl::Duration lease_remaining;
  int64_t plan_version = 0;  // of its last heartbeat
  absl::Time join_time;
  std::optional<StepStats> last_step;
  // What plans multiply its speed by (MeasuredSpeed::factor).
  double speed_factor = 1.0;
  bool draining = false;
  // Not a rank of the job's latest plan (JobSpec::trainers' standbys).
  bool standby = false;
};

class Membership {
 public:
  // Every pointer must outlive the membership.
  Membership(const CoordinatorOptions* options, const Clock* clock,
             JobTable* table, StoreQueue* queue, PlanPublisher* plans);
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Joins the worker (a retry from the same instance keeps its lease and
  // token; another instance takes over only an expired lease) and returns
  // once the plan that includes it is published, or the planner said why
  // none can be (see PlanPublisher::GetPlan). The lease runs from the
  // answer. INVALID_ARGUMENT or RESOURCE_EXHAUSTED naming the field
  // (ValidateJoinJob, a cost table that does not parse or names another
  // GPU model); NOT_FOUND naming job; ALREADY_EXISTS naming worker_id while
  // another instance's lease is live; RESOURCE_EXHAUSTED naming worker_id
  // beyond max_workers_per_job; UNAVAILABLE when the store fails.
  absl::StatusOr<JoinGrant> JoinJob(const JoinRequest& request);

  // Renews the lease, and records whether the worker has a trainer: when
  // that changes the job's ranks (RankedMembers: a standby's trainer
  // attached while a rank has none), the lease monitor re-plans the job.
  // Never waits on planning or the store. NOT_FOUND
  // (job, or a worker_id without a lease), UNAUTHENTICATED (worker_token),
  // FAILED_PRECONDITION naming instance_id (another process holds the
  // lease) or plan_version when it is above the job's latest: the worker
  // follows a plan this coordinator never published and must join again.
  absl::StatusOr<HeartbeatReply> Heartbeat(const HeartbeatRequest& request);

  // Removes the worker and re-plans its job (OK also when the job is
  // deleted meanwhile), returning the plan version that no longer has it
  // (0 when the job is gone). With request.drain the worker stays a member
  // but is marked draining: the re-plan keeps it a rank that owns nothing,
  // so the next step hands its momentum to the new owners; returns that
  // plan's version (a repeated drain answers the same). A drain that leaves
  // no worker to own the matrices is FAILED_PRECONDITION naming drain; one
  // whose plan fails (RESOURCE_EXHAUSTED: the others lack the memory) is
  // undone. Errors as Heartbeat's, and UNAVAILABLE.
  absl::StatusOr<int64_t> LeaveJob(const LeaveRequest& request);

  // Marks the member draining as LeaveJob with drain does, for an operator
  // (the service's bearer token is the authentication: a drain loses
  // nothing). NOT_FOUND naming worker_id for a non-member. The worker
  // learns it from its next heartbeat.
  absl::StatusOr<int64_t> DrainWorker(const DrainRequest& request);

  // The members of `job` ("" for every job), each job's in join order.
  // NOT_FOUND naming job.
  absl::StatusOr<std::vector<WorkerView>> ListWorkers(const std::string& job);

  // Drops every worker whose lease has expired and re-plans their jobs, and
  // every job whose ranks a heartbeat changed (errors are logged). Returns
  // "job/worker" for each dropped worker.
  std::vector<std::string> ExpireLeases();

 private:
  // Marks `worker_id` of `job` draining and re-plans (LeaveJob's drain
  // rules); `member` finds and authenticates it, under the table's mutex.
  absl::StatusOr<int64_t> Drain(
      const std::string& job, const std::string& worker_id,
      const std::function<absl::StatusOr<WorkerRecord*>(JobRecord*)>& member);

  const CoordinatorOptions& options_;
  const Clock& clock_;
  JobTable* const table_;
  StoreQueue* const queue_;
  PlanPublisher* const plans_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_MEMBERSHIP_H_
