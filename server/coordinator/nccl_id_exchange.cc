#include "server/coordinator/nccl_id_exchange.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/coordinator/request_validation.h"

namespace muonps {
namespace coordinator {
namespace {

constexpr size_t kNcclIdBytes = 128;

// Job `name` when `worker_id` authenticates in it with `worker_token` and
// `certificate`; the first of their errors otherwise.
absl::StatusOr<JobRecord*> FindJobOfWorker(JobTable* table,
                                           const std::string& name,
                                           const std::string& worker_id,
                                           const std::string& worker_token,
                                           const std::string& certificate)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(table->mutex()) {
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, table->Find(name));
  MUONPS_RETURN_IF_ERROR(
      job->members.Authenticate(name, worker_id, worker_token, certificate)
          .status());
  return job;
}

}  // namespace

absl::Status NcclIdExchange::PutNcclId(const NcclIdPut& r) {
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id, "worker_id"));
  if (r.plan_version < 1) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version, " < 1"));
  }
  if (r.nccl_id.size() != kNcclIdBytes) {
    return InvalidField(
        "nccl_id", absl::StrCat(r.nccl_id.size(),
                                " bytes; an ncclUniqueId has ", kNcclIdBytes));
  }
  int64_t seq = 0;
  {
    absl::MutexLock lock(table_->mutex());
    MUONPS_ASSIGN_OR_RETURN(JobRecord * job,
                            FindJobOfWorker(table_, r.job, r.worker_id,
                                            r.worker_token, r.certificate));
    PlanVersion* plan = job->plans.newest();
    const int64_t latest = job->plans.latest_version();
    if (plan == nullptr || !job->plans.error().empty() ||
        r.plan_version != latest) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition, "plan_version",
          absl::StrCat(r.plan_version, " is not the current ", latest,
                       job->plans.error().empty()
                           ? ""
                           : absl::StrCat(" (", job->plans.error(), ")")));
    }
    const std::vector<std::string>& ranks = plan->plan->ownership.worker_ids;
    const std::string rank0 = ranks.empty() ? std::string() : ranks[0];
    if (rank0 != r.worker_id) {
      return FieldError(absl::StatusCode::kFailedPrecondition, "worker_id",
                        absl::StrCat(Quoted(r.worker_id), " is not rank 0 (",
                                     Quoted(rank0), " is)"));
    }
    if (r.generation < 0) {
      return InvalidField("generation", absl::StrCat(r.generation, " < 0"));
    }
    bool retry = false;
    if (!plan->nccl_id.empty()) {
      if (r.generation < plan->nccl_generation) {
        return FieldError(
            absl::StatusCode::kFailedPrecondition, "generation",
            absl::StrCat(r.generation, " is older than the stored ",
                         plan->nccl_generation, " of plan_version ",
                         r.plan_version));
      }
      if (r.generation == plan->nccl_generation) {
        if (plan->nccl_id != r.nccl_id) {
          return FieldError(
              absl::StatusCode::kAlreadyExists, "nccl_id",
              absl::StrCat("plan_version ", r.plan_version, " generation ",
                           r.generation, " already has a different id"));
        }
        retry = true;
      }
    }
    if (retry) {
      seq = queue_->last_enqueued();  // the original may be on its way
    } else {
      plan->nccl_id = r.nccl_id;
      plan->nccl_generation = r.generation;
      plan->nccl_put_at = absl::Now();
      seq = queue_->Enqueue({store_op::PutNcclId{r.job, r.plan_version,
                                                 r.nccl_id, r.generation}});
    }
  }
  return queue_->Persist(seq);
}

absl::StatusOr<NcclId> NcclIdExchange::GetNcclId(const NcclIdGet& r) {
  if (r.plan_version < 1) {
    return InvalidField("plan_version", absl::StrCat(r.plan_version, " < 1"));
  }
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id, "worker_id"));
  absl::MutexLock lock(table_->mutex());
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job,
                          FindJobOfWorker(table_, r.job, r.worker_id,
                                          r.worker_token, r.certificate));
  const PlanVersion* plan = job->plans.newest();
  const int64_t latest = job->plans.latest_version();
  if (plan == nullptr || r.plan_version != latest) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan_version",
        absl::StrCat(r.plan_version, " is not the current ", latest));
  }
  const std::vector<std::string>& workers = plan->plan->ownership.worker_ids;
  if (std::find(workers.begin(), workers.end(), r.worker_id) == workers.end()) {
    return FieldError(
        absl::StatusCode::kPermissionDenied, "worker_id",
        absl::StrCat(Quoted(r.worker_id), " is not a worker of plan_version ",
                     r.plan_version));
  }
  if (plan->nccl_id.empty() || plan->nccl_generation < r.min_generation) {
    return FieldError(
        absl::StatusCode::kNotFound, "nccl_id",
        absl::StrCat("rank 0 has not put it (generation >= ", r.min_generation,
                     ") for plan_version ", r.plan_version, " yet"));
  }
  const absl::Duration age = plan->nccl_put_at == absl::InfinitePast()
                                 ? absl::ZeroDuration()
                                 : absl::Now() - plan->nccl_put_at;
  return NcclId{plan->nccl_id, plan->nccl_generation, age};
}

}  // namespace coordinator
}  // namespace muonps
