#include "server/coordinator/coordinator_state.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/secret.h"
#include "common/status.h"
#include "scheduler/planner.h"
#include "scheduler/step_schedule.h"
#include "server/coordinator/plan_proto.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

constexpr size_t kNcclIdBytes = 128;

int64_t ToMs(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

absl::Status NotFoundJob(const std::string& job) {
  return FieldError(absl::StatusCode::kNotFound, "job",
                    absl::StrCat(Quoted(job), " does not exist"));
}

}  // namespace

CoordinatorState::CoordinatorState(const CoordinatorOptions& options,
                                   Clock clock)
    : options_(options), clock_(std::move(clock)) {}

absl::StatusOr<CoordinatorState::JobRecord*> CoordinatorState::FindJob(
    const std::string& job) {
  MUONPS_RETURN_IF_ERROR(ValidateId(job, "job"));
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return NotFoundJob(job);
  return &it->second;
}

v1::Job CoordinatorState::JobToProto(const std::string& name,
                                     const JobRecord& job) const {
  v1::Job out;
  out.set_name(absl::StrCat("jobs/", name));
  for (const std::string& id : job.join_order) out.add_workers(id);
  out.set_plan_version(job.latest_version);
  out.set_create_time_ms(absl::ToUnixMillis(job.create_time));
  return out;
}

absl::StatusOr<v1::Job> CoordinatorState::CreateJob(
    const v1::CreateJobRequest& request) {
  MUONPS_RETURN_IF_ERROR(ValidateCreateJob(request, options_.limits));
  MUONPS_ASSIGN_OR_RETURN(std::vector<scheduler::MatrixSpec> matrices,
                          ValidateJobSpec(request.job(), options_.limits));
  const std::string& name = request.job().name();
  // Specs of big jobs are megabytes: copied outside the mutex.
  JobRecord fresh;
  fresh.spec = std::make_shared<const v1::JobSpec>(request.job());
  fresh.create_request_id = request.request_id();
  fresh.create_time = clock_();
  fresh.matrices = std::make_shared<const std::vector<scheduler::MatrixSpec>>(
      std::move(matrices));
  fresh.plan_error = "no worker has joined";
  fresh.job_token = RandomHex(32);
  fresh.data_plane_secret = RandomHex(32);
  StoredJob stored;
  stored.name = name;
  stored.spec = *fresh.spec;
  stored.create_request_id = fresh.create_request_id;
  stored.create_time_ms = absl::ToUnixMillis(fresh.create_time);
  stored.job_token = fresh.job_token;
  stored.data_plane_secret = fresh.data_plane_secret;
  v1::Job out;
  std::shared_ptr<const v1::JobSpec> spec;
  int64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(name);
    if (it != jobs_.end()) {
      if (request.request_id().empty() ||
          request.request_id() != it->second.create_request_id) {
        return FieldError(absl::StatusCode::kAlreadyExists, "job.name",
                          absl::StrCat(Quoted(name), " already exists"));
      }
      out = JobToProto(name, it->second);  // a retry
      out.set_job_token(it->second.job_token);
      spec = it->second.spec;
      seq = enqueued_seq_;  // the original may still be on its way to disk
    } else {
      if (static_cast<int64_t>(jobs_.size()) >= options_.limits.max_jobs) {
        return FieldError(absl::StatusCode::kResourceExhausted, "job",
                          absl::StrCat("the coordinator holds its limit of ",
                                       options_.limits.max_jobs, " jobs"));
      }
      JobRecord& job = jobs_[name];
      job = std::move(fresh);
      job.incarnation = next_incarnation_++;
      auto floor = version_floors_.find(name);
      if (floor != version_floors_.end()) job.latest_version = floor->second;
      seq = Enqueue(store_op::PutJob{std::move(stored)});
      spdlog::info("job={} created: {} matrices{}", name, job.matrices->size(),
                   job.latest_version > 0
                       ? absl::StrCat(", plan versions continue after ",
                                      job.latest_version)
                       : "");
      out = JobToProto(name, job);
      out.set_job_token(job.job_token);
      spec = job.spec;
    }
  }
  *out.mutable_spec() = *spec;
  MUONPS_RETURN_IF_ERROR(Persist(seq));
  return out;
}

absl::StatusOr<v1::Job> CoordinatorState::GetJob(const std::string& job) {
  v1::Job out;
  std::shared_ptr<const v1::JobSpec> spec;
  {
    absl::MutexLock lock(&mu_);
    MUONPS_ASSIGN_OR_RETURN(JobRecord * record, FindJob(job));
    out = JobToProto(job, *record);
    spec = record->spec;
  }
  *out.mutable_spec() = *spec;
  return out;
}

v1::ListJobsResponse CoordinatorState::ListJobs() {
  absl::MutexLock lock(&mu_);
  v1::ListJobsResponse out;
  for (const auto& [name, job] : jobs_) {
    v1::JobSummary* s = out.add_jobs();
    s->set_name(name);
    int64_t matrices = 0, parameters = 0;
    for (const scheduler::MatrixSpec& m : *job.matrices) {
      matrices += m.experts;
      parameters += m.experts * m.rows * m.cols;
    }
    s->set_matrices(matrices);
    s->set_parameters(parameters);
    s->set_workers(static_cast<int32_t>(job.workers.size()));
    s->set_plan_version(job.latest_version);
  }
  return out;
}

absl::Status CoordinatorState::DeleteJob(const v1::DeleteJobRequest& r) {
  const std::string& job = r.job();
  int64_t seq = 0;
  JobRecord doomed;
  {
    absl::MutexLock lock(&mu_);
    MUONPS_ASSIGN_OR_RETURN(JobRecord * record, FindJob(job));
    if (!SecretsEqual(r.job_token(), record->job_token)) {
      return FieldError(
          absl::StatusCode::kUnauthenticated, "job_token",
          absl::StrCat(r.job_token().empty() ? "missing" : "wrong",
                       ": DeleteJob needs the token CreateJob returned for "
                       "job ",
                       Quoted(job)));
    }
    int64_t& floor = version_floors_[job];
    floor = std::max(floor, record->latest_version);
    seq = Enqueue(store_op::DeleteJob{job, floor});
    doomed = std::move(*record);  // freed outside the mutex: megabytes
    jobs_.erase(job);
    plan_changed_.SignalAll();
    spdlog::info("job={} deleted", job);
  }
  return Persist(seq);
}

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
    }
  }
  return out;
}

absl::StatusOr<v1::Plan> CoordinatorState::GetPlan(
    const v1::GetPlanRequest& r) {
  if (r.version() < 0) {
    return InvalidField("version", absl::StrCat(r.version(), " < 0"));
  }
  std::shared_ptr<const v1::Plan> found;
  {
    absl::MutexLock lock(&mu_);
    MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
    if (r.version() == 0) {
      if (!job->plan_error.empty() || job->plans.empty()) {
        return FieldError(
            absl::StatusCode::kFailedPrecondition, "job",
            absl::StrCat(Quoted(r.job()), " has no current plan: ",
                         job->plan_error.empty() ? "none published yet"
                                                 : job->plan_error));
      }
      found = job->plans.back().proto;
    } else {
      for (const PlanRecord& p : job->plans) {
        if (p.proto->version() == r.version()) found = p.proto;
      }
      if (found == nullptr) {
        return FieldError(
            absl::StatusCode::kNotFound, "version",
            r.version() > job->latest_version
                ? absl::StrCat(r.version(), " does not exist yet (latest ",
                               job->latest_version, ")")
                : absl::StrCat(r.version(), " was pruned (the oldest kept is ",
                               job->plans.empty()
                                   ? 0
                                   : job->plans.front().proto->version(),
                               ")"));
      }
    }
  }
  return *found;  // copied outside the lock: big jobs' plans are megabytes
}

absl::StatusOr<std::optional<v1::Plan>> CoordinatorState::WaitForPlan(
    const std::string& job, int64_t known_version, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::shared_ptr<const v1::Plan> found;
  {
    absl::MutexLock lock(&mu_);
    while (true) {
      MUONPS_ASSIGN_OR_RETURN(JobRecord * record, FindJob(job));
      // Other than the caller's: newer, or the current one for a caller
      // ahead of every version this job published.
      if (!record->plans.empty() && record->plan_error.empty() &&
          record->plans.back().proto->version() != known_version) {
        found = record->plans.back().proto;
        break;
      }
      if (plan_changed_.WaitWithDeadline(&mu_, deadline)) {
        return std::optional<v1::Plan>();
      }
    }
  }
  return std::optional<v1::Plan>(*found);
}

absl::Status CoordinatorState::PutNcclId(const v1::PutNcclIdRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id(), "worker_id"));
  if (r.plan_version() < 1) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version(), " < 1"));
  }
  if (r.nccl_id().size() != kNcclIdBytes) {
    return InvalidField(
        "nccl_id", absl::StrCat(r.nccl_id().size(),
                                " bytes; an ncclUniqueId has ", kNcclIdBytes));
  }
  int64_t seq = 0;
  {
    absl::MutexLock lock(&mu_);
    MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
    MUONPS_RETURN_IF_ERROR(
        AuthenticateWorker(r.job(), job, r.worker_id(), r.worker_token())
            .status());
    if (job->plans.empty() || !job->plan_error.empty() ||
        r.plan_version() != job->latest_version) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition, "plan_version",
          absl::StrCat(r.plan_version(), " is not the current ",
                       job->latest_version,
                       job->plan_error.empty()
                           ? ""
                           : absl::StrCat(" (", job->plan_error, ")")));
    }
    PlanRecord& plan = job->plans.back();
    if (plan.proto->workers(0) != r.worker_id()) {
      return FieldError(absl::StatusCode::kFailedPrecondition, "worker_id",
                        absl::StrCat(Quoted(r.worker_id()), " is not rank 0 (",
                                     Quoted(plan.proto->workers(0)), " is)"));
    }
    if (r.generation() < 0) {
      return InvalidField("generation", absl::StrCat(r.generation(), " < 0"));
    }
    bool retry = false;
    if (!plan.nccl_id.empty()) {
      if (r.generation() < plan.nccl_generation) {
        return FieldError(
            absl::StatusCode::kFailedPrecondition, "generation",
            absl::StrCat(r.generation(), " is older than the stored ",
                         plan.nccl_generation, " of plan_version ",
                         r.plan_version()));
      }
      if (r.generation() == plan.nccl_generation) {
        if (plan.nccl_id != r.nccl_id()) {
          return FieldError(
              absl::StatusCode::kAlreadyExists, "nccl_id",
              absl::StrCat("plan_version ", r.plan_version(), " generation ",
                           r.generation(), " already has a different id"));
        }
        retry = true;
      }
    }
    if (!retry) {
      plan.nccl_id = r.nccl_id();
      plan.nccl_generation = r.generation();
      Enqueue(store_op::PutNcclId{r.job(), r.plan_version(), r.nccl_id(),
                                  r.generation()});
    }
    seq = enqueued_seq_;
  }
  return Persist(seq);
}

absl::StatusOr<v1::GetNcclIdResponse> CoordinatorState::GetNcclId(
    const v1::GetNcclIdRequest& r) {
  if (r.plan_version() < 1) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version(), " < 1"));
  }
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id(), "worker_id"));
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
  MUONPS_RETURN_IF_ERROR(
      AuthenticateWorker(r.job(), job, r.worker_id(), r.worker_token())
          .status());
  if (job->plans.empty() || r.plan_version() != job->latest_version) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "plan_version",
                      absl::StrCat(r.plan_version(), " is not the current ",
                                   job->latest_version));
  }
  const PlanRecord& plan = job->plans.back();
  const auto& workers = plan.proto->workers();
  if (std::find(workers.begin(), workers.end(), r.worker_id()) ==
      workers.end()) {
    return FieldError(
        absl::StatusCode::kPermissionDenied, "worker_id",
        absl::StrCat(Quoted(r.worker_id()), " is not a worker of plan_version ",
                     r.plan_version()));
  }
  if (plan.nccl_id.empty() || plan.nccl_generation < r.min_generation()) {
    return FieldError(absl::StatusCode::kNotFound, "nccl_id",
                      absl::StrCat("rank 0 has not put it (generation >= ",
                                   r.min_generation(), ") for plan_version ",
                                   r.plan_version(), " yet"));
  }
  v1::GetNcclIdResponse out;
  out.set_nccl_id(plan.nccl_id);
  out.set_generation(plan.nccl_generation);
  return out;
}

absl::Status CoordinatorState::ReportStepStats(
    const v1::ReportStepStatsRequest& r) {
  if (r.step() < 0) return InvalidField("step", absl::StrCat(r.step(), " < 0"));
  for (const auto& [value, field] :
       {std::pair<double, const char*>{r.step_seconds(), "step_seconds"},
        {r.ns_seconds(), "ns_seconds"}}) {
    if (!std::isfinite(value) || value < 0) {
      return InvalidField(field, absl::StrCat(value, " must be finite, >= 0"));
    }
  }
  if (r.bytes_moved() < 0) {
    return InvalidField("bytes_moved", absl::StrCat(r.bytes_moved(), " < 0"));
  }
  if (r.plan_version() < 0) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version(), " < 0"));
  }
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id(), "worker_id"));
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
  MUONPS_RETURN_IF_ERROR(
      AuthenticateWorker(r.job(), job, r.worker_id(), r.worker_token())
          .status());
  if (r.plan_version() > job->latest_version) {
    return InvalidField(
        "plan_version",
        absl::StrCat(r.plan_version(), " is newer than the latest, ",
                     job->latest_version));
  }
  return absl::OkStatus();
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

StateCounts CoordinatorState::Counts() {
  absl::MutexLock lock(&mu_);
  StateCounts counts;
  counts.jobs = static_cast<int64_t>(jobs_.size());
  for (const auto& [name, job] : jobs_) {
    counts.workers += static_cast<int64_t>(job.workers.size());
  }
  counts.plan_versions = published_versions_;
  return counts;
}

}  // namespace coordinator
}  // namespace muonps
