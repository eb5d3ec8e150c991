#include "server/coordinator/job_catalog.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "common/status.h"
#include "server/coordinator/request_validation.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

// The job as GetJob answers it (no token).
JobInfo InfoOf(const std::string& name, const JobRecord& job) {
  JobInfo out;
  out.name = name;
  out.spec = job.spec;
  out.workers = job.members.join_order();
  out.plan_version = job.plans.latest_version();
  out.create_time = job.create_time;
  return out;
}

}  // namespace

JobCatalog::JobCatalog(const CoordinatorOptions* options, const Clock* clock,
                       JobTable* table, StoreQueue* queue, PlanPublisher* plans)
    : options_(*options),
      clock_(*clock),
      table_(table),
      queue_(queue),
      plans_(plans) {}

absl::StatusOr<JobInfo> JobCatalog::CreateJob(CreateJobRequest request) {
  MUONPS_RETURN_IF_ERROR(
      ValidateCreateJob(request.request_id, request.job, options_.limits));
  const std::string name = request.job.name;
  // Built outside the mutex: specs of big jobs are megabytes.
  JobRecord fresh;
  fresh.spec = std::make_shared<const JobSpec>(std::move(request.job));
  fresh.matrices = std::shared_ptr<const std::vector<scheduler::MatrixSpec>>(
      fresh.spec, &fresh.spec->matrices);
  fresh.create_request_id = request.request_id;
  fresh.create_time = clock_();
  fresh.plans.set_error("no worker has joined");
  fresh.job_token = RandomHex(32);
  fresh.data_plane_secret = RandomHex(32);
  StoredJob stored;
  stored.name = name;
  stored.spec = fresh.spec;
  stored.create_request_id = fresh.create_request_id;
  stored.create_time_ms = absl::ToUnixMillis(fresh.create_time);
  stored.job_token = fresh.job_token;
  stored.data_plane_secret = fresh.data_plane_secret;
  JobInfo out;
  int64_t seq = 0;
  {
    absl::MutexLock lock(table_->mutex());
    auto& jobs = table_->jobs();
    auto it = jobs.find(name);
    if (it != jobs.end()) {
      if (request.request_id.empty() ||
          request.request_id != it->second.create_request_id) {
        return FieldError(absl::StatusCode::kAlreadyExists, "job.name",
                          absl::StrCat(Quoted(name), " already exists"));
      }
      out = InfoOf(name, it->second);  // a retry
      out.job_token = it->second.job_token;
      // The original may still be on its way to disk.
      seq = queue_->last_enqueued();
    } else {
      if (static_cast<int64_t>(jobs.size()) >= options_.limits.max_jobs) {
        return FieldError(absl::StatusCode::kResourceExhausted, "job",
                          absl::StrCat("the coordinator holds its limit of ",
                                       options_.limits.max_jobs, " jobs"));
      }
      JobRecord& job = table_->Insert(name, std::move(fresh));
      seq = queue_->Enqueue({store_op::PutJob{std::move(stored)}});
      const int64_t floor = job.plans.latest_version();
      spdlog::info("job={} created: {} matrices{}", name, job.matrices->size(),
                   floor > 0
                       ? absl::StrCat(", plan versions continue after ", floor)
                       : "");
      out = InfoOf(name, job);
      out.job_token = job.job_token;
    }
  }
  MUONPS_RETURN_IF_ERROR(queue_->Persist(seq));
  return out;
}

absl::StatusOr<JobInfo> JobCatalog::GetJob(const std::string& job) {
  absl::MutexLock lock(table_->mutex());
  MUONPS_ASSIGN_OR_RETURN(JobRecord * record, table_->Find(job));
  return InfoOf(job, *record);
}

std::vector<JobSummary> JobCatalog::ListJobs() {
  absl::MutexLock lock(table_->mutex());
  std::vector<JobSummary> out;
  for (const auto& [name, job] : table_->jobs()) {
    JobSummary& s = out.emplace_back();
    s.name = name;
    for (const scheduler::MatrixSpec& m : *job.matrices) {
      s.matrices += m.experts;
      s.parameters += m.experts * m.rows * m.cols;
    }
    s.workers = static_cast<int32_t>(job.members.size());
    s.plan_version = job.plans.latest_version();
  }
  return out;
}

absl::Status JobCatalog::DeleteJob(const DeleteJobRequest& request) {
  const std::string& job = request.job;
  int64_t seq = 0;
  JobRecord doomed;  // freed outside the mutex: megabytes
  {
    absl::MutexLock lock(table_->mutex());
    MUONPS_ASSIGN_OR_RETURN(JobRecord * record, table_->Find(job));
    if (!SecretsEqual(request.job_token, record->job_token)) {
      return FieldError(
          absl::StatusCode::kUnauthenticated, "job_token",
          absl::StrCat(request.job_token.empty() ? "missing" : "wrong",
                       ": DeleteJob needs the token CreateJob returned for "
                       "job ",
                       Quoted(job)));
    }
    const int64_t floor = table_->Remove(job, &doomed);
    seq = queue_->Enqueue({store_op::DeleteJob{job, floor}});
    plans_->WakeWatchers();
    spdlog::info("job={} deleted", job);
  }
  return queue_->Persist(seq);
}

StateCounts JobCatalog::Counts() {
  absl::MutexLock lock(table_->mutex());
  StateCounts counts;
  counts.jobs = static_cast<int64_t>(table_->jobs().size());
  for (const auto& [name, job] : table_->jobs()) {
    counts.workers += static_cast<int64_t>(job.members.size());
  }
  counts.plan_versions = plans_->published_versions();
  return counts;
}

}  // namespace coordinator
}  // namespace muonps
