#include "server/coordinator/plan_history.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace coordinator {

void PlanHistory::ContinueAfter(int64_t version) {
  latest_version_ = std::max(latest_version_, version);
}

absl::StatusOr<std::shared_ptr<const PublishedPlan>> PlanHistory::Find(
    const std::string& job, int64_t version) const {
  if (version == 0) {
    if (!error_.empty() || kept_.empty()) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition, "job",
          absl::StrCat(Quoted(job), " has no current plan: ",
                       error_.empty() ? "none published yet" : error_));
    }
    return kept_.back().plan;
  }
  for (const PlanVersion& kept : kept_) {
    if (kept.plan->version == version) return kept.plan;
  }
  return FieldError(
      absl::StatusCode::kNotFound, "version",
      version > latest_version_
          ? absl::StrCat(version, " does not exist yet (latest ",
                         latest_version_, ")")
          : absl::StrCat(version, " was pruned (the oldest kept is ",
                         kept_.empty() ? 0 : kept_.front().plan->version, ")"));
}

void PlanHistory::Publish(std::shared_ptr<const PublishedPlan> plan, int keep) {
  latest_version_ = plan->version;
  kept_.push_back({std::move(plan), "", 0});
  while (static_cast<int>(kept_.size()) > keep) kept_.pop_front();
  error_.clear();
}

void PlanHistory::Restore(PlanVersion version) {
  ContinueAfter(version.plan->version);
  kept_.push_back(std::move(version));
}

}  // namespace coordinator
}  // namespace muonps
