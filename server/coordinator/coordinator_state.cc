// CoordinatorState's jobs: creating, reading, listing and deleting them, and
// the counts for metrics. Membership and leases are in
// coordinator_membership.cc, published plans and NCCL ids in
// coordinator_published_plans.cc, planning in coordinator_planning.cc and
// durability in coordinator_restore.cc.
#include "server/coordinator/coordinator_state.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

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
