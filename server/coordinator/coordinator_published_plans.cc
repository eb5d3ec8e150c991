// CoordinatorState's published plans as workers read them: GetPlan and
// WaitForPlan, the NCCL ids rank 0 puts for a plan version and its peers get,
// and the step stats workers report against a plan version (the newest kept
// in each worker's record for ListWorkers).
#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/translate.h"
#include "server/coordinator/coordinator_state.h"

namespace muonps {
namespace coordinator {
namespace {

constexpr size_t kNcclIdBytes = 128;

}  // namespace

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
    MUONPS_ASSIGN_OR_RETURN(
        JobRecord * job,
        FindJobOfWorker(r.job(), r.worker_id(), r.worker_token()));
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
  MUONPS_ASSIGN_OR_RETURN(
      JobRecord * job,
      FindJobOfWorker(r.job(), r.worker_id(), r.worker_token()));
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
        {r.ns_seconds(), "ns_seconds"},
        {r.predicted_ns_seconds(), "predicted_ns_seconds"}}) {
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
  MUONPS_ASSIGN_OR_RETURN(
      WorkerRecord * worker,
      AuthenticateWorker(r.job(), job, r.worker_id(), r.worker_token()));
  if (r.plan_version() > job->latest_version) {
    return InvalidField(
        "plan_version",
        absl::StrCat(r.plan_version(), " is newer than the latest, ",
                     job->latest_version));
  }
  // A worker reports its steps in order; an id at or below the one held (a
  // trainer that resumed from an earlier step) leaves the newest in place.
  if (!worker->last_step.has_value() || r.step() > worker->last_step->step()) {
    worker->last_step = proto::WorkerStepStatsFromReport(r);
  }
  job->stepped = true;
  return absl::OkStatus();
}

}  // namespace coordinator
}  // namespace muonps
