// JobMembers: the workers of one job and their leases: who joined, in what
// order (plans rank workers in join order), with what credential, until
// when their lease runs, and the newest step each reported. Every change
// bumps the membership generation and may leave a reason for the next
// plan; Add and Remove return the store op that makes the change durable.
//
// Thread-compatible: the JobTable's mutex guards it (it lives in the job's
// JobRecord).
#ifndef MUONPS_SERVER_COORDINATOR_JOB_MEMBERS_H_
#define MUONPS_SERVER_COORDINATOR_JOB_MEMBERS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "scheduler/cost_table.h"
#include "server/coordinator/job_store.h"
#include "server/coordinator/measured_speed.h"
#include "server/coordinator/worker_types.h"

namespace muonps {
namespace coordinator {

// A member of a job.
struct WorkerRecord {
  JoinRequest join;
  std::shared_ptr<const scheduler::CostTable> costs;  // null: none
  absl::Time join_time;
  absl::Time lease_expiry;
  // The plan version of its last heartbeat.
  int64_t reported_version = 0;
  // The credential JoinJob handed out; the worker's other calls carry it.
  std::string token;
  int64_t join_seq = 0;
  // The membership generation of its last change that plans see (its join,
  // a drain): a plan of a later generation knows it as it is.
  int64_t generation = 0;
  // The newest step it reported (highest step id); nullopt until one.
  std::optional<StepStats> last_step;
  // Its Newton-Schulz speed as its steps measure it (plans multiply
  // join.speed by its factor). Live state, not stored, like last_step.
  MeasuredSpeed speed;
  // Leaving (LeaveJob with drain): a rank of the job's plans that owns
  // nothing, so its momentum moves to the new owners at the next step.
  bool draining = false;
  // Its heartbeat says a trainer is attached (or asked to attach lately).
  // Live state, not stored: a restarted coordinator learns it again from
  // the next heartbeats, and keeps the ranks of its stored plan meanwhile.
  bool has_trainer = false;
  // The rank of its trainer, as its heartbeats last named one; kept while
  // they name none (a trainer attaching again mostly has the same rank).
  // Live state, not stored, like has_trainer. nullopt: never named.
  std::optional<int32_t> trainer_rank;
};

class JobMembers {
 public:
  // The member `worker_id`, or null.
  WorkerRecord* Find(const std::string& worker_id);
  const WorkerRecord& at(const std::string& worker_id) const {
    return workers_.at(worker_id);
  }
  bool contains(const std::string& worker_id) const {
    return workers_.count(worker_id) > 0;
  }
  // Member ids in join order.
  const std::vector<std::string>& join_order() const { return join_order_; }
  size_t size() const { return workers_.size(); }
  bool empty() const { return workers_.empty(); }

  // `worker_id`'s record if `worker_token` is the token JoinJob gave it and
  // the call's client `certificate` is the one it joined with (when it
  // joined with one): NOT_FOUND naming worker_id when it holds no lease,
  // UNAUTHENTICATED naming worker_token, PERMISSION_DENIED naming worker_id
  // for another certificate. `job` names the job in messages.
  absl::StatusOr<WorkerRecord*> Authenticate(const std::string& job,
                                             const std::string& worker_id,
                                             const std::string& worker_token,
                                             const std::string& certificate);
  // Authenticate, and the lease must be held by `instance_id` (the process
  // that joined): FAILED_PRECONDITION naming instance_id otherwise.
  absl::StatusOr<WorkerRecord*> AuthenticateLease(
      const std::string& job, const std::string& worker_id,
      const std::string& worker_token, const std::string& instance_id,
      const std::string& certificate);

  // Adds `worker` (its join.worker_id must not be a member) last in join
  // order, with the next join sequence number and a new generation, and
  // "worker ID joined" as a reason. Returns the op that stores it in `job`.
  StoreOp Add(const std::string& job, WorkerRecord worker);
  // Removes member `worker_id` with a new generation; `reason` ("" for
  // none) becomes part of the next plan's. Returns the op for the store.
  StoreOp Remove(const std::string& job, const std::string& worker_id,
                 const std::string& reason);
  // Marks member `worker_id` draining (or not) with a new generation and
  // "worker ID draining" as a reason. Returns the op for the store.
  StoreOp SetDraining(const std::string& job, const std::string& worker_id,
                      bool draining);
  // Records what `worker_id`'s heartbeat says of its trainer; true when
  // that changed (no generation: see Touch).
  bool SetHasTrainer(const std::string& worker_id, bool has_trainer);
  // Records the trainer rank `worker_id`'s heartbeat names (nullopt: none,
  // which keeps the one it named before); true when that changed it (no
  // generation: see Touch).
  bool SetTrainerRank(const std::string& worker_id,
                      std::optional<int32_t> trainer_rank);
  // A change that needs a new plan and no store op (a standby's trainer):
  // a new generation with `reason`.
  void Touch(std::string reason);
  // Members `ids` measured the speeds `factors` (RebalanceByMeasurement),
  // for plans from `version` on: a new generation that changes them, with
  // `reason`. No store op: measurements live in memory.
  void SetMeasuredSpeeds(const std::vector<std::string>& ids,
                         const std::vector<double>& factors, int64_t version,
                         std::string reason);
  // Members whose lease ran out by `now`, by id.
  std::vector<std::string> Expired(absl::Time now) const;

  // Restores a stored member (its join_seq kept), last in join order.
  void Restore(const std::string& worker_id, WorkerRecord worker);

  // Bumped by every change of the members.
  int64_t generation() const { return generation_; }
  void set_generation(int64_t generation) { generation_ = generation; }

  // Why the members changed since the last plan, oldest first.
  const std::vector<std::string>& reasons() const { return reasons_; }
  void AddReason(std::string reason) { reasons_.push_back(std::move(reason)); }
  // Drops the oldest `count` reasons (those a plan took up).
  void DropReasons(size_t count);

 private:
  std::map<std::string, WorkerRecord> workers_;
  std::vector<std::string> join_order_;
  int64_t next_join_seq_ = 1;
  int64_t generation_ = 0;
  std::vector<std::string> reasons_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_JOB_MEMBERS_H_
