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

// What the planner assumes for a device nobody measured.
scheduler::DeviceRates RatesFor(const v1::Device& device) {
  scheduler::DeviceRates rates;
  if (device.kind() == "cpu") {
    rates.flops_per_second = 1e11;
    rates.memory_bytes_per_second = 2e10;
    rates.call_overhead_seconds = 1e-5;
    rates.link_bytes_per_second = 1e9;
  }
  return rates;
}

scheduler::AlgorithmPolicy PolicyOf(const v1::MuonHyperparameters& h) {
  switch (h.ns_algorithm()) {
    case v1::NS_ALGORITHM_NS5:
      return scheduler::AlgorithmPolicy::kNs5;
    case v1::NS_ALGORITHM_GRAM:
      return scheduler::AlgorithmPolicy::kGram;
    default:
      return scheduler::AlgorithmPolicy::kAuto;
  }
}

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
  *out.mutable_spec() = job.spec;
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
  absl::MutexLock lock(&mu_);
  const std::string& name = request.job().name();
  auto it = jobs_.find(name);
  if (it != jobs_.end()) {
    if (!request.request_id().empty() &&
        request.request_id() == it->second.create_request_id) {
      v1::Job retry = JobToProto(name, it->second);
      retry.set_job_token(it->second.job_token);
      return retry;
    }
    return FieldError(absl::StatusCode::kAlreadyExists, "job.name",
                      absl::StrCat(Quoted(name), " already exists"));
  }
  if (static_cast<int64_t>(jobs_.size()) >= options_.limits.max_jobs) {
    return FieldError(absl::StatusCode::kResourceExhausted, "job",
                      absl::StrCat("the coordinator holds its limit of ",
                                   options_.limits.max_jobs, " jobs"));
  }
  JobRecord& job = jobs_[name];
  job.spec = request.job();
  job.create_request_id = request.request_id();
  job.create_time = clock_();
  job.matrices = std::move(matrices);
  job.plan_error = "no worker has joined";
  job.job_token = RandomHex(32);
  job.data_plane_secret = RandomHex(32);
  spdlog::info("job={} created: {} matrices", name, job.matrices.size());
  v1::Job out = JobToProto(name, job);
  out.set_job_token(job.job_token);
  return out;
}

absl::StatusOr<v1::Job> CoordinatorState::GetJob(const std::string& job) {
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * record, FindJob(job));
  return JobToProto(job, *record);
}

v1::ListJobsResponse CoordinatorState::ListJobs() {
  absl::MutexLock lock(&mu_);
  v1::ListJobsResponse out;
  for (const auto& [name, job] : jobs_) {
    v1::JobSummary* s = out.add_jobs();
    s->set_name(name);
    int64_t matrices = 0, parameters = 0;
    for (const scheduler::MatrixSpec& m : job.matrices) {
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
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * record, FindJob(job));
  if (!SecretsEqual(r.job_token(), record->job_token)) {
    return FieldError(absl::StatusCode::kUnauthenticated, "job_token",
                      absl::StrCat(r.job_token().empty() ? "missing" : "wrong",
                                   ": DeleteJob needs the token CreateJob "
                                   "returned for job ",
                                   Quoted(job)));
  }
  jobs_.erase(job);
  plan_changed_.SignalAll();
  spdlog::info("job={} deleted", job);
  return absl::OkStatus();
}

void CoordinatorState::Replan(const std::string& name, JobRecord* job,
                              const std::string& reason) {
  if (job->workers.empty()) {
    job->plan_error = "the job has no workers";
    return;
  }
  scheduler::PlanInput input;
  input.matrices = job->matrices;
  const v1::MuonHyperparameters& muon = job->spec.muon();
  input.options.ns_steps = muon.ns_steps() > 0 ? muon.ns_steps() : 5;
  input.options.algorithm = PolicyOf(muon);
  int64_t smallest = 0;
  // Ranks: workers with trainers in join order, then dedicated ones.
  std::vector<std::string> ranked;
  int32_t dedicated = 0;
  for (const bool want_dedicated : {false, true}) {
    for (const std::string& id : job->join_order) {
      if (job->workers.at(id).join.dedicated() != want_dedicated) continue;
      ranked.push_back(id);
      dedicated += want_dedicated ? 1 : 0;
    }
  }
  for (const std::string& id : ranked) {
    const WorkerRecord& w = job->workers.at(id);
    scheduler::WorkerSpec spec;
    spec.id = id;
    spec.costs = w.costs;
    spec.rates = RatesFor(w.join.device());
    spec.speed = w.join.speed() > 0 ? w.join.speed() : 1.0;
    spec.memory_bytes = w.join.device().memory_bytes();
    spec.colocated = w.join.device().colocated();
    smallest = smallest == 0 ? spec.memory_bytes
                             : std::min(smallest, spec.memory_bytes);
    input.workers.push_back(std::move(spec));
  }
  // Work buffers: 2 GiB, or an eighth of the smallest worker's memory.
  input.options.workspace_bytes =
      std::min<int64_t>(int64_t{2} << 30, smallest / 8);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<scheduler::OwnershipPlan> plan =
      job->plans.empty() ? scheduler::PlanOwnership(input)
                         : scheduler::Replan(input, job->plans.back().plan);
  if (plan.ok()) plan->dedicated = dedicated;
  absl::StatusOr<scheduler::StepSchedule> schedule =
      plan.ok() ? scheduler::BuildStepSchedule(
                      job->matrices, *plan,
                      {.bucket_bytes = job->spec.bucket_bytes() > 0
                                           ? job->spec.bucket_bytes()
                                           : int64_t{64} << 20})
                : absl::StatusOr<scheduler::StepSchedule>(plan.status());
  const double plan_ms = std::chrono::duration<double, std::milli>(
                             std::chrono::steady_clock::now() - start)
                             .count();
  if (!schedule.ok()) {
    job->plan_error = std::string(schedule.status().message());
    spdlog::warn("job={} cannot be planned ({}): {}", name, reason,
                 job->plan_error);
    return;
  }
  job->plan_error.clear();
  PlanRecord record;
  record.plan = *std::move(plan);
  record.proto = PlanToProto({.job = name,
                              .version = ++job->latest_version,
                              .reason = reason,
                              .plan_ms = plan_ms},
                             job->matrices, record.plan, *schedule);
  spdlog::info(
      "job={} plan_version={} ({}): {} workers, max {:.3f} ms, imbalance "
      "{:.4f}, moved {} bytes, planned in {:.1f} ms",
      name, job->latest_version, reason, input.workers.size(),
      record.plan.max_seconds * 1e3, record.plan.imbalance,
      record.plan.moved_bytes, plan_ms);
  job->plans.push_back(std::move(record));
  while (static_cast<int>(job->plans.size()) > options_.plan_history) {
    job->plans.pop_front();
  }
  ++published_versions_;
  plan_changed_.SignalAll();
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
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
  const absl::Time now = clock_();
  v1::JoinJobResponse out;
  out.set_lease_ttl_ms(ToMs(options_.lease_ttl));
  out.set_heartbeat_interval_ms(ToMs(options_.heartbeat_interval));
  auto it = job->workers.find(r.worker_id());
  if (it != job->workers.end()) {
    WorkerRecord& old = it->second;
    if (old.join.instance_id() == r.instance_id()) {
      old.lease_expiry = now + options_.lease_ttl;  // a retry
      out.set_plan_version(job->latest_version);
      out.set_worker_token(old.token);
      out.set_data_plane_secret(job->data_plane_secret);
      return out;
    }
    if (old.lease_expiry > now) {
      return FieldError(
          absl::StatusCode::kAlreadyExists, "worker_id",
          absl::StrCat(Quoted(r.worker_id()),
                       " is held by a live lease of another instance for ",
                       ToMs(old.lease_expiry - now), " ms more"));
    }
    RemoveWorker(job, r.worker_id());  // its lease ran out: take over
  }
  if (static_cast<int64_t>(job->workers.size()) >=
      options_.limits.max_workers_per_job) {
    return FieldError(
        absl::StatusCode::kResourceExhausted, "worker_id",
        absl::StrCat("job ", Quoted(r.job()), " holds its limit of ",
                     options_.limits.max_workers_per_job, " workers"));
  }
  WorkerRecord& w = job->workers[r.worker_id()];
  w.join = r;
  w.costs = std::move(costs);
  w.join_time = now;
  w.lease_expiry = now + options_.lease_ttl;
  w.token = RandomHex(32);
  job->join_order.push_back(r.worker_id());
  spdlog::info("job={} worker={} joined ({} {} on {})", r.job(), r.worker_id(),
               r.device().kind(), r.device().name(), r.device().host());
  Replan(r.job(), job, absl::StrCat("worker ", r.worker_id(), " joined"));
  out.set_plan_version(job->latest_version);
  out.set_worker_token(w.token);
  out.set_data_plane_secret(job->data_plane_secret);
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

void CoordinatorState::RemoveWorker(JobRecord* job,
                                    const std::string& worker_id) {
  job->workers.erase(worker_id);
  job->join_order.erase(
      std::remove(job->join_order.begin(), job->join_order.end(), worker_id),
      job->join_order.end());
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorState::Heartbeat(
    const v1::HeartbeatRequest& r) {
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id(), "worker_id"));
  if (r.plan_version() < 0) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version(), " < 0"));
  }
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
  MUONPS_ASSIGN_OR_RETURN(
      WorkerRecord * worker,
      AuthenticateWorker(r.job(), job, r.worker_id(), r.worker_token()));
  if (worker->join.instance_id() != r.instance_id()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "instance_id",
                      "the lease belongs to another instance of this worker");
  }
  if (r.plan_version() > job->latest_version) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version(),
                                                     " is newer than the "
                                                     "latest, ",
                                                     job->latest_version));
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
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
  MUONPS_ASSIGN_OR_RETURN(
      WorkerRecord * worker,
      AuthenticateWorker(r.job(), job, r.worker_id(), r.worker_token()));
  if (worker->join.instance_id() != r.instance_id()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "instance_id",
                      "the lease belongs to another instance of this worker");
  }
  RemoveWorker(job, r.worker_id());
  spdlog::info("job={} worker={} left", r.job(), r.worker_id());
  Replan(r.job(), job, absl::StrCat("worker ", r.worker_id(), " left"));
  return absl::OkStatus();
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
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, FindJob(r.job()));
  if (r.version() == 0) {
    if (!job->plan_error.empty()) {
      return FieldError(absl::StatusCode::kFailedPrecondition, "job",
                        absl::StrCat(Quoted(r.job()), " has no current plan: ",
                                     job->plan_error));
    }
    return job->plans.back().proto;
  }
  for (const PlanRecord& p : job->plans) {
    if (p.proto.version() == r.version()) return p.proto;
  }
  return FieldError(
      absl::StatusCode::kNotFound, "version",
      r.version() > job->latest_version
          ? absl::StrCat(r.version(), " does not exist yet (latest ",
                         job->latest_version, ")")
          : absl::StrCat(
                r.version(), " was pruned (the oldest kept is ",
                job->plans.empty() ? 0 : job->plans.front().proto.version(),
                ")"));
}

absl::StatusOr<std::optional<v1::Plan>> CoordinatorState::WaitForPlan(
    const std::string& job, int64_t known_version, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::MutexLock lock(&mu_);
  while (true) {
    MUONPS_ASSIGN_OR_RETURN(JobRecord * record, FindJob(job));
    if (record->latest_version > known_version && !record->plans.empty() &&
        record->plan_error.empty()) {
      return std::optional<v1::Plan>(record->plans.back().proto);
    }
    if (plan_changed_.WaitWithDeadline(&mu_, deadline)) {
      return std::optional<v1::Plan>();
    }
  }
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
  if (plan.proto.workers(0) != r.worker_id()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "worker_id",
                      absl::StrCat(Quoted(r.worker_id()), " is not rank 0 (",
                                   Quoted(plan.proto.workers(0)), " is)"));
  }
  if (r.generation() < 0) {
    return InvalidField("generation", absl::StrCat(r.generation(), " < 0"));
  }
  if (!plan.nccl_id.empty()) {
    if (r.generation() < plan.nccl_generation) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition, "generation",
          absl::StrCat(r.generation(), " is older than the stored ",
                       plan.nccl_generation, " of plan_version ",
                       r.plan_version()));
    }
    if (r.generation() == plan.nccl_generation) {
      if (plan.nccl_id == r.nccl_id()) return absl::OkStatus();
      return FieldError(
          absl::StatusCode::kAlreadyExists, "nccl_id",
          absl::StrCat("plan_version ", r.plan_version(), " generation ",
                       r.generation(), " already has a different id"));
    }
  }
  plan.nccl_id = r.nccl_id();
  plan.nccl_generation = r.generation();
  return absl::OkStatus();
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
  if (std::find(plan.proto.workers().begin(), plan.proto.workers().end(),
                r.worker_id()) == plan.proto.workers().end()) {
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
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  std::vector<std::string> expired;
  for (auto& [name, job] : jobs_) {
    std::vector<std::string> lost;
    for (const auto& [id, w] : job.workers) {
      if (w.lease_expiry <= now) lost.push_back(id);
    }
    if (lost.empty()) continue;
    for (const std::string& id : lost) {
      RemoveWorker(&job, id);
      expired.push_back(absl::StrCat(name, "/", id));
      spdlog::warn("job={} worker={} lease expired", name, id);
    }
    Replan(name, &job,
           absl::StrCat("lease expired: ", absl::StrJoin(lost, ", ")));
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
