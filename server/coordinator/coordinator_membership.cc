// CoordinatorState's membership: workers joining, authenticating, sending
// heartbeats and leaving, their listing, and the expiry of their leases.
// Every change of a job's workers here ends in PlanAtLeast
// (coordinator_planning.cc).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/secret.h"
#include "common/status.h"
#include "server/coordinator/coordinator_state.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

int64_t ToMs(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

void CoordinatorState::AddWorker(const std::string& name, JobRecord* job,
                                 WorkerRecord worker) {
  const std::string id = worker.join.worker_id();
  worker.join_seq = job->next_join_seq++;
  worker.generation = ++job->membership_generation;
  StoredWorker stored;
  stored.worker_id = id;
  stored.join = worker.join;
  stored.join_time_ms = absl::ToUnixMillis(worker.join_time);
  stored.token = worker.token;
  stored.join_seq = worker.join_seq;
  Enqueue(store_op::PutWorker{name, std::move(stored)});
  job->workers[id] = std::move(worker);
  job->join_order.push_back(id);
  job->pending_reasons.push_back(absl::StrCat("worker ", id, " joined"));
}

void CoordinatorState::RemoveWorker(const std::string& name, JobRecord* job,
                                    const std::string& worker_id,
                                    const std::string& reason) {
  job->workers.erase(worker_id);
  job->join_order.erase(
      std::remove(job->join_order.begin(), job->join_order.end(), worker_id),
      job->join_order.end());
  ++job->membership_generation;
  if (!reason.empty()) job->pending_reasons.push_back(reason);
  Enqueue(store_op::DeleteWorker{name, worker_id});
}

absl::StatusOr<v1::JoinJobResponse> CoordinatorState::JoinJob(
    const v1::JoinJobRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateJoinJob(r, options_.limits));
  std::shared_ptr<const scheduler::CostTable> costs;
  if (!r.cost_table().empty()) {
    absl::StatusOr<scheduler::CostTable> table =
        scheduler::CostTable::Parse(r.cost_table());
    if (!table.ok()) {
      return InvalidField("cost_table", table.status().message());
    }
    // Times of another GPU model would mislead the planner. (A CPU worker
    // names no model; its table names its CPU.)
    if (!table->device().empty() && !r.device().name().empty() &&
        table->device() != r.device().name()) {
      return InvalidField("cost_table",
                          absl::StrCat("measured on ", Quoted(table->device()),
                                       ", but this worker's device.name is ",
                                       Quoted(r.device().name())));
    }
    costs = std::make_shared<const scheduler::CostTable>(*std::move(table));
  }
  v1::JoinJobResponse out;
  out.set_lease_ttl_ms(ToMs(options_.lease_ttl));
  out.set_heartbeat_interval_ms(ToMs(options_.heartbeat_interval));
  uint64_t incarnation = 0;
  int64_t generation = 0, seq = 0;
  {
    absl::MutexLock lock(&mu_);
    MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
    const absl::Time now = clock_();
    auto it = job->workers.find(r.worker_id());
    if (it != job->workers.end() &&
        it->second.join.instance_id() == r.instance_id()) {
      it->second.lease_expiry = now + options_.lease_ttl;  // a retry
      out.set_worker_token(it->second.token);
      generation = it->second.generation;
    } else {
      if (it != job->workers.end()) {
        const WorkerRecord& old = it->second;
        if (old.lease_expiry > now) {
          return FieldError(
              absl::StatusCode::kAlreadyExists, "worker_id",
              absl::StrCat(Quoted(r.worker_id()),
                           " is held by a live lease of another instance for ",
                           ToMs(old.lease_expiry - now), " ms more"));
        }
        // Its lease ran out: take over.
        RemoveWorker(r.job(), job, r.worker_id(),
                     absl::StrCat("worker ", r.worker_id(), " replaced"));
      }
      if (static_cast<int64_t>(job->workers.size()) >=
          options_.limits.max_workers_per_job) {
        return FieldError(
            absl::StatusCode::kResourceExhausted, "worker_id",
            absl::StrCat("job ", Quoted(r.job()), " holds its limit of ",
                         options_.limits.max_workers_per_job, " workers"));
      }
      WorkerRecord w;
      w.join = r;
      w.costs = std::move(costs);
      w.join_time = now;
      w.lease_expiry = now + options_.lease_ttl;
      w.token = RandomHex(32);
      out.set_worker_token(w.token);
      AddWorker(r.job(), job, std::move(w));
      generation = job->membership_generation;
      spdlog::info("job={} worker={} joined ({} {} on {})", r.job(),
                   r.worker_id(), r.device().kind(), r.device().name(),
                   r.device().host());
    }
    out.set_data_plane_secret(job->data_plane_secret);
    incarnation = job->incarnation;
    seq = enqueued_seq_;
  }
  MUONPS_RETURN_IF_ERROR(Persist(seq));
  MUONPS_ASSIGN_OR_RETURN(const int64_t version,
                          PlanAtLeast(r.job(), incarnation, generation));
  out.set_plan_version(version);
  // The lease runs from the answer, not from the start of planning.
  absl::MutexLock lock(&mu_);
  if (JobRecord* job = FindIncarnation(r.job(), incarnation)) {
    auto w = job->workers.find(r.worker_id());
    if (w != job->workers.end() && w->second.token == out.worker_token()) {
      w->second.lease_expiry = clock_() + options_.lease_ttl;
    }
  }
  return out;
}

absl::StatusOr<CoordinatorState::WorkerRecord*>
CoordinatorState::AuthenticateWorker(const std::string& job_name,
                                     JobRecord* job,
                                     const std::string& worker_id,
                                     const std::string& worker_token) {
  auto it = job->workers.find(worker_id);
  if (it == job->workers.end()) {
    return FieldError(absl::StatusCode::kNotFound, "worker_id",
                      absl::StrCat(Quoted(worker_id), " holds no lease in job ",
                                   Quoted(job_name),
                                   " (expired or never joined): join again"));
  }
  if (!SecretsEqual(worker_token, it->second.token)) {
    return FieldError(
        absl::StatusCode::kUnauthenticated, "worker_token",
        absl::StrCat(worker_token.empty() ? "missing" : "wrong",
                     ": not the token JoinJob gave worker ", Quoted(worker_id),
                     " of job ", Quoted(job_name)));
  }
  return &it->second;
}

absl::StatusOr<CoordinatorState::JobRecord*> CoordinatorState::FindJobOfWorker(
    const std::string& job_name, const std::string& worker_id,
    const std::string& worker_token) {
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(job_name));
  MUONPS_RETURN_IF_ERROR(
      AuthenticateWorker(job_name, job, worker_id, worker_token).status());
  return job;
}

absl::StatusOr<CoordinatorState::WorkerRecord*>
CoordinatorState::AuthenticateLease(const std::string& job_name, JobRecord* job,
                                    const std::string& worker_id,
                                    const std::string& worker_token,
                                    const std::string& instance_id) {
  MUONPS_ASSIGN_OR_RETURN(
      WorkerRecord * worker,
      AuthenticateWorker(job_name, job, worker_id, worker_token));
  if (worker->join.instance_id() != instance_id) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "instance_id",
                      "the lease belongs to another instance of this worker");
  }
  return worker;
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorState::Heartbeat(
    const v1::HeartbeatRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id(), "worker_id"));
  if (r.plan_version() < 0) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version(), " < 0"));
  }
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
  MUONPS_ASSIGN_OR_RETURN(WorkerRecord * worker,
                          AuthenticateLease(r.job(), job, r.worker_id(),
                                            r.worker_token(), r.instance_id()));
  if (r.plan_version() > job->latest_version) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan_version",
        absl::StrCat(r.plan_version(), " is newer than job ", Quoted(r.job()),
                     "'s latest, ", job->latest_version,
                     ": a plan this coordinator never published (it "
                     "restarted without its state?); join again"));
  }
  worker->lease_expiry = clock_() + options_.lease_ttl;
  worker->reported_version = r.plan_version();
  v1::HeartbeatResponse out;
  out.set_lease_ttl_ms(ToMs(options_.lease_ttl));
  out.set_plan_version(job->latest_version);
  return out;
}

absl::Status CoordinatorState::LeaveJob(const v1::LeaveJobRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id(), "worker_id"));
  uint64_t incarnation = 0;
  int64_t generation = 0, seq = 0;
  {
    absl::MutexLock lock(&mu_);
    MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
    MUONPS_RETURN_IF_ERROR(AuthenticateLease(r.job(), job, r.worker_id(),
                                             r.worker_token(), r.instance_id())
                               .status());
    RemoveWorker(r.job(), job, r.worker_id(),
                 absl::StrCat("worker ", r.worker_id(), " left"));
    spdlog::info("job={} worker={} left", r.job(), r.worker_id());
    incarnation = job->incarnation;
    generation = job->membership_generation;
    seq = enqueued_seq_;
  }
  MUONPS_RETURN_IF_ERROR(Persist(seq));
  const absl::Status planned =
      PlanAtLeast(r.job(), incarnation, generation).status();
  // The worker has left either way once the job is gone.
  return planned.code() == absl::StatusCode::kNotFound ? absl::OkStatus()
                                                       : planned;
}

absl::StatusOr<v1::ListWorkersResponse> CoordinatorState::ListWorkers(
    const v1::ListWorkersRequest& r) {
  absl::MutexLock lock(&mu_);
  if (!r.job().empty()) MUONPS_RETURN_IF_ERROR(FindJob(r.job()).status());
  const absl::Time now = clock_();
  v1::ListWorkersResponse out;
  for (const auto& [name, job] : jobs_) {
    if (!r.job().empty() && name != r.job()) continue;
    for (const std::string& id : job.join_order) {
      const WorkerRecord& w = job.workers.at(id);
      v1::WorkerInfo* info = out.add_workers();
      info->set_job(name);
      info->set_worker_id(id);
      *info->mutable_device() = w.join.device();
      info->set_data_address(w.join.data_address());
      info->set_lease_remaining_ms(ToMs(w.lease_expiry - now));
      info->set_plan_version(w.reported_version);
      info->set_join_time_ms(absl::ToUnixMillis(w.join_time));
      if (w.last_step.has_value()) *info->mutable_last_step() = *w.last_step;
    }
  }
  return out;
}

std::vector<std::string> CoordinatorState::ExpireLeases() {
  struct Replan {
    std::string job;
    uint64_t incarnation;
    int64_t generation;
  };
  std::vector<std::string> expired;
  std::vector<Replan> replans;
  int64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = clock_();
    for (auto& [name, job] : jobs_) {
      std::vector<std::string> lost;
      for (const auto& [id, w] : job.workers) {
        if (w.lease_expiry <= now) lost.push_back(id);
      }
      if (lost.empty()) continue;
      for (const std::string& id : lost) {
        RemoveWorker(name, &job, id, "");
        expired.push_back(absl::StrCat(name, "/", id));
        spdlog::warn("job={} worker={} lease expired", name, id);
      }
      job.pending_reasons.push_back(
          absl::StrCat("lease expired: ", absl::StrJoin(lost, ", ")));
      replans.push_back({name, job.incarnation, job.membership_generation});
    }
    seq = enqueued_seq_;
  }
  if (const absl::Status s = Persist(seq); !s.ok()) {
    spdlog::error("expired leases: {}", s.ToString());
    return expired;
  }
  for (const Replan& r : replans) {
    const absl::Status s =
        PlanAtLeast(r.job, r.incarnation, r.generation).status();
    if (!s.ok() && s.code() != absl::StatusCode::kNotFound) {
      spdlog::error("job={} re-plan after expired leases: {}", r.job,
                    s.ToString());
    }
  }
  return expired;
}

}  // namespace coordinator
}  // namespace muonps
