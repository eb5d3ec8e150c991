#include "server/coordinator/membership.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/secret.h"
#include "common/status.h"
#include "scheduler/cost_table.h"
#include "server/coordinator/plan_computation.h"
#include "server/coordinator/request_validation.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

int64_t ToMs(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

// The worker's cost table (null without one). INVALID_ARGUMENT naming
// cost_table when it does not parse or was measured on another GPU model
// (its times would mislead the planner; a CPU worker names no model, its
// table names its CPU).
absl::StatusOr<std::shared_ptr<const scheduler::CostTable>> CostsOf(
    const JoinRequest& r) {
  if (r.cost_table.empty()) return nullptr;
  absl::StatusOr<scheduler::CostTable> table =
      scheduler::CostTable::Parse(r.cost_table);
  if (!table.ok()) return InvalidField("cost_table", table.status().message());
  if (!table->device().empty() && !r.device.name.empty() &&
      table->device() != r.device.name) {
    return InvalidField("cost_table",
                        absl::StrCat("measured on ", Quoted(table->device()),
                                     ", but this worker's device.name is ",
                                     Quoted(r.device.name)));
  }
  return std::make_shared<const scheduler::CostTable>(*std::move(table));
}

}  // namespace

Membership::Membership(const CoordinatorOptions* options, const Clock* clock,
                       JobTable* table, StoreQueue* queue, PlanPublisher* plans)
    : options_(*options),
      clock_(*clock),
      table_(table),
      queue_(queue),
      plans_(plans) {}

absl::StatusOr<JoinGrant> Membership::JoinJob(const JoinRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateJoinJob(r, options_.limits));
  MUONPS_ASSIGN_OR_RETURN(std::shared_ptr<const scheduler::CostTable> costs,
                          CostsOf(r));
  JoinGrant out;
  out.lease_ttl = options_.lease_ttl;
  out.heartbeat_interval = options_.heartbeat_interval;
  uint64_t incarnation = 0;
  int64_t generation = 0, seq = 0;
  {
    absl::MutexLock lock(table_->mutex());
    MUONPS_ASSIGN_OR_RETURN(JobRecord * job, table_->Find(r.job));
    const absl::Time now = clock_();
    WorkerRecord* held = job->members.Find(r.worker_id);
    std::vector<StoreOp> ops;
    if (held != nullptr && !held->join.certificate.empty() &&
        held->join.certificate != r.certificate) {
      return FieldError(
          absl::StatusCode::kPermissionDenied, "worker_id",
          absl::StrCat(Quoted(r.worker_id), " is a member of job ",
                       Quoted(r.job),
                       " that joined with the client "
                       "certificate ",
                       held->join.certificate, "; this join came with ",
                       r.certificate.empty() ? "none" : r.certificate));
    }
    if (held != nullptr && held->join.instance_id == r.instance_id) {
      held->lease_expiry = now + options_.lease_ttl;  // a retry
      out.worker_token = held->token;
      generation = held->generation;
    } else {
      if (held != nullptr) {
        if (held->lease_expiry > now) {
          return FieldError(
              absl::StatusCode::kAlreadyExists, "worker_id",
              absl::StrCat(Quoted(r.worker_id),
                           " is held by a live lease of another instance for ",
                           ToMs(held->lease_expiry - now), " ms more"));
        }
        // Its lease ran out: take over.
        ops.push_back(job->members.Remove(
            r.job, r.worker_id,
            absl::StrCat("worker ", r.worker_id, " replaced")));
      }
      if (static_cast<int64_t>(job->members.size()) >=
          options_.limits.max_workers_per_job) {
        // A takeover's removal stands, as a lost lease would have.
        queue_->Enqueue(std::move(ops));
        return FieldError(
            absl::StatusCode::kResourceExhausted, "worker_id",
            absl::StrCat("job ", Quoted(r.job), " holds its limit of ",
                         options_.limits.max_workers_per_job, " workers"));
      }
      WorkerRecord w;
      w.join = r;
      w.costs = std::move(costs);
      w.join_time = now;
      w.lease_expiry = now + options_.lease_ttl;
      w.token = RandomHex(32);
      out.worker_token = w.token;
      ops.push_back(job->members.Add(r.job, std::move(w)));
      generation = job->members.generation();
      spdlog::info("job={} worker={} joined ({} {} on {})", r.job, r.worker_id,
                   r.device.kind, r.device.name, r.device.host);
    }
    out.data_plane_secret = job->data_plane_secret;
    incarnation = job->incarnation;
    // Also a retry's: its original may still be on its way to disk.
    seq =
        ops.empty() ? queue_->last_enqueued() : queue_->Enqueue(std::move(ops));
  }
  MUONPS_RETURN_IF_ERROR(queue_->Persist(seq));
  MUONPS_ASSIGN_OR_RETURN(out.plan_version,
                          plans_->PlanAtLeast(r.job, incarnation, generation));
  // The lease runs from the answer, not from the start of planning.
  absl::MutexLock lock(table_->mutex());
  if (JobRecord* job = table_->FindIncarnation(r.job, incarnation)) {
    WorkerRecord* w = job->members.Find(r.worker_id);
    if (w != nullptr && w->token == out.worker_token) {
      w->lease_expiry = clock_() + options_.lease_ttl;
    }
  }
  return out;
}

absl::StatusOr<HeartbeatReply> Membership::Heartbeat(
    const HeartbeatRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id, "worker_id"));
  if (r.plan_version < 0) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version, " < 0"));
  }
  if (r.trainer_rank.has_value() && *r.trainer_rank < 0) {
    return InvalidField("trainer_rank", absl::StrCat(*r.trainer_rank, " < 0"));
  }
  absl::MutexLock lock(table_->mutex());
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, table_->Find(r.job));
  MUONPS_ASSIGN_OR_RETURN(
      WorkerRecord * worker,
      job->members.AuthenticateLease(r.job, r.worker_id, r.worker_token,
                                     r.instance_id, r.certificate));
  const int64_t latest = job->plans.latest_version();
  if (r.plan_version > latest) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan_version",
        absl::StrCat(r.plan_version, " is newer than job ", Quoted(r.job),
                     "'s latest, ", latest,
                     ": a plan this coordinator never published (it "
                     "restarted without its state?); join again"));
  }
  worker->lease_expiry = clock_() + options_.lease_ttl;
  worker->reported_version = r.plan_version;
  bool touched = false;
  if (job->members.SetHasTrainer(r.worker_id, r.has_trainer) &&
      job->spec->trainers > 0) {
    // A standby whose trainer attached while a rank has none changes the
    // ranks: planned by the lease monitor (ExpireLeases), not here.
    if (!NewestPlanRanksMembers(*job)) {
      job->members.Touch(
          absl::StrCat("worker ", r.worker_id,
                       r.has_trainer ? " has a trainer" : " has no trainer"));
      touched = true;
    }
  }
  // A job of replica groups groups its ranks by their trainers' ranks
  // (PlanSnapshot::replica_groups), and a job whose trainers hold whole
  // experts leaves them with their holders (PlanSnapshot::trainer_shards):
  // a rank's new trainer rank may change either, planned by the lease
  // monitor too (a plan made with the same trainer ranks stands).
  if (job->members.SetTrainerRank(r.worker_id, r.trainer_rank) &&
      (job->spec->replicas > 1 ||
       scheduler::HoldsWholeExperts(*job->matrices)) &&
      !touched) {
    const std::vector<std::string> ranked = RankedMembers(*job);
    if (std::find(ranked.begin(), ranked.end(), r.worker_id) != ranked.end()) {
      job->members.Touch(absl::StrCat("worker ", r.worker_id,
                                      "'s trainer is rank ", *r.trainer_rank));
    }
  }
  return HeartbeatReply{options_.lease_ttl, latest, worker->draining};
}

absl::StatusOr<int64_t> Membership::DrainWorker(const DrainRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id, "worker_id"));
  return Drain(r.job, r.worker_id,
               [&r](JobRecord* job) -> absl::StatusOr<WorkerRecord*> {
                 WorkerRecord* worker = job->members.Find(r.worker_id);
                 if (worker == nullptr) {
                   return FieldError(
                       absl::StatusCode::kNotFound, "worker_id",
                       absl::StrCat(Quoted(r.worker_id),
                                    " is not a member of job ", Quoted(r.job)));
                 }
                 return worker;
               });
}

absl::StatusOr<int64_t> Membership::Drain(
    const std::string& job_name, const std::string& worker_id,
    const std::function<absl::StatusOr<WorkerRecord*>(JobRecord*)>& member) {
  uint64_t incarnation = 0;
  int64_t generation = 0, seq = 0;
  std::string token;
  {
    absl::MutexLock lock(table_->mutex());
    MUONPS_ASSIGN_OR_RETURN(JobRecord * job, table_->Find(job_name));
    MUONPS_ASSIGN_OR_RETURN(WorkerRecord * worker, member(job));
    incarnation = job->incarnation;
    token = worker->token;
    if (worker->draining) {
      // A repeat: answer the plan its drain made.
      seq = queue_->last_enqueued();
    } else {
      bool others = false;
      for (const std::string& id : job->members.join_order()) {
        others |= id != worker_id && !job->members.at(id).draining;
      }
      if (!others) {
        return FieldError(
            absl::StatusCode::kFailedPrecondition, "drain",
            absl::StrCat("worker ", Quoted(worker_id), " of job ",
                         Quoted(job_name),
                         " is the last that can own matrices: no worker "
                         "can take its momentum; leave without drain (its "
                         "momentum then survives in checkpoints only)"));
      }
      seq = queue_->Enqueue(
          {job->members.SetDraining(job_name, worker_id, true)});
      spdlog::info("job={} worker={} draining", job_name, worker_id);
    }
    generation = job->members.generation();
  }
  MUONPS_RETURN_IF_ERROR(queue_->Persist(seq));
  absl::StatusOr<int64_t> planned =
      plans_->PlanAtLeast(job_name, incarnation, generation);
  if (planned.ok() || planned.status().code() == absl::StatusCode::kNotFound) {
    return planned;
  }
  // No plan can do without it (the others lack the memory): undo.
  {
    absl::MutexLock lock(table_->mutex());
    JobRecord* job = table_->FindIncarnation(job_name, incarnation);
    WorkerRecord* worker =
        job == nullptr ? nullptr : job->members.Find(worker_id);
    if (worker == nullptr || worker->token != token || !worker->draining) {
      return planned.status();
    }
    seq =
        queue_->Enqueue({job->members.SetDraining(job_name, worker_id, false)});
    generation = job->members.generation();
  }
  spdlog::warn("job={} worker={} drain undone: {}", job_name, worker_id,
               planned.status().ToString());
  if (queue_->Persist(seq).ok()) {
    (void)plans_->PlanAtLeast(job_name, incarnation, generation);
  }
  return planned.status();
}

absl::StatusOr<int64_t> Membership::LeaveJob(const LeaveRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id, "worker_id"));
  if (r.drain) {
    return Drain(r.job, r.worker_id,
                 [&r](JobRecord* job) -> absl::StatusOr<WorkerRecord*> {
                   return job->members.AuthenticateLease(
                       r.job, r.worker_id, r.worker_token, r.instance_id,
                       r.certificate);
                 });
  }
  uint64_t incarnation = 0;
  int64_t generation = 0, seq = 0;
  {
    absl::MutexLock lock(table_->mutex());
    MUONPS_ASSIGN_OR_RETURN(JobRecord * job, table_->Find(r.job));
    MUONPS_RETURN_IF_ERROR(job->members
                               .AuthenticateLease(r.job, r.worker_id,
                                                  r.worker_token, r.instance_id,
                                                  r.certificate)
                               .status());
    seq = queue_->Enqueue({job->members.Remove(
        r.job, r.worker_id, absl::StrCat("worker ", r.worker_id, " left"))});
    spdlog::info("job={} worker={} left", r.job, r.worker_id);
    incarnation = job->incarnation;
    generation = job->members.generation();
  }
  MUONPS_RETURN_IF_ERROR(queue_->Persist(seq));
  const absl::StatusOr<int64_t> planned =
      plans_->PlanAtLeast(r.job, incarnation, generation);
  // The worker has left either way once the job is gone.
  if (planned.status().code() == absl::StatusCode::kNotFound) return 0;
  return planned;
}

absl::StatusOr<std::vector<WorkerView>> Membership::ListWorkers(
    const std::string& job) {
  absl::MutexLock lock(table_->mutex());
  if (!job.empty()) MUONPS_RETURN_IF_ERROR(table_->Find(job).status());
  const absl::Time now = clock_();
  std::vector<WorkerView> out;
  for (const auto& [name, record] : table_->jobs()) {
    if (!job.empty() && name != job) continue;
    const PlanVersion* newest = record.plans.newest();
    for (const std::string& id : record.members.join_order()) {
      const WorkerRecord& w = record.members.at(id);
      WorkerView& view = out.emplace_back();
      view.job = name;
      view.worker_id = id;
      view.device = w.join.device;
      view.data_address = w.join.data_address;
      view.lease_remaining = w.lease_expiry - now;
      view.plan_version = w.reported_version;
      view.join_time = w.join_time;
      view.last_step = w.last_step;
      view.speed_factor = w.speed.factor();
      view.draining = w.draining;
      view.standby = newest == nullptr ||
                     std::find(newest->plan->ownership.worker_ids.begin(),
                               newest->plan->ownership.worker_ids.end(),
                               id) == newest->plan->ownership.worker_ids.end();
    }
  }
  return out;
}

std::vector<std::string> Membership::ExpireLeases() {
  struct Replan {
    std::string job;
    uint64_t incarnation;
    int64_t generation;
  };
  std::vector<std::string> expired;
  std::vector<Replan> replans;
  int64_t seq = 0;
  {
    absl::MutexLock lock(table_->mutex());
    const absl::Time now = clock_();
    std::vector<StoreOp> ops;
    for (auto& [name, job] : table_->jobs()) {
      const std::vector<std::string> lost = job.members.Expired(now);
      if (lost.empty()) {
        // A change no caller planned (Heartbeat's).
        if (job.plans.planned_generation < job.members.generation() &&
            !job.plans.planning) {
          replans.push_back({name, job.incarnation, job.members.generation()});
        }
        continue;
      }
      for (const std::string& id : lost) {
        ops.push_back(job.members.Remove(name, id, ""));
        expired.push_back(absl::StrCat(name, "/", id));
        spdlog::warn("job={} worker={} lease expired", name, id);
      }
      job.members.AddReason(
          absl::StrCat("lease expired: ", absl::StrJoin(lost, ", ")));
      replans.push_back({name, job.incarnation, job.members.generation()});
    }
    seq =
        ops.empty() ? queue_->last_enqueued() : queue_->Enqueue(std::move(ops));
  }
  if (const absl::Status s = queue_->Persist(seq); !s.ok()) {
    spdlog::error("expired leases: {}", s.ToString());
    return expired;
  }
  for (const Replan& r : replans) {
    const absl::Status s =
        plans_->PlanAtLeast(r.job, r.incarnation, r.generation).status();
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
      spdlog::error("job={} re-plan after expired leases: {}", r.job,
                    s.ToString());
    }
  }
  return expired;
}

}  // namespace coordinator
}  // namespace muonps
