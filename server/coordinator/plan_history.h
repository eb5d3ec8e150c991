// PlanHistory: the plan versions of one job: the latest versions kept for
// GetPlan (oldest pruned), the NCCL id rank 0 put for each, the job's
// latest version number (which never goes back), why the current members
// have no plan when they have none, and the state of the job's one
// planner (PlanPublisher's handshake).
//
// Thread-compatible: the JobTable's mutex guards it (it lives in the job's
// JobRecord).
#ifndef MUONPS_SERVER_COORDINATOR_PLAN_HISTORY_H_
#define MUONPS_SERVER_COORDINATOR_PLAN_HISTORY_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/coordinator/published_plan.h"

namespace muonps {
namespace coordinator {

// A kept plan version and the NCCL id rank 0 put for it ("" until then).
struct PlanVersion {
  std::shared_ptr<const PublishedPlan> plan;
  std::string nccl_id;
  int64_t nccl_generation = 0;
  // When rank 0 put it; InfinitePast: not known (restored from the store).
  absl::Time nccl_put_at = absl::InfinitePast();
};

class PlanHistory {
 public:
  // The newest version published (or restored, or inherited from a deleted
  // job of the same name); 0 before any.
  int64_t latest_version() const { return latest_version_; }
  // Raises latest_version to `version` (never lowers it).
  void ContinueAfter(int64_t version);

  // Why the current members have no plan ("" when the newest kept version
  // is theirs).
  const std::string& error() const { return error_; }
  void set_error(std::string error) { error_ = std::move(error); }

  // The newest kept version, or null when none is kept.
  PlanVersion* newest() { return kept_.empty() ? nullptr : &kept_.back(); }
  const PlanVersion* newest() const {
    return kept_.empty() ? nullptr : &kept_.back();
  }
  // The newest kept version when it is the current members' plan (no
  // error), else null.
  const PlanVersion* current() const {
    return error_.empty() ? newest() : nullptr;
  }

  // GetPlan's answer for `version` (0: the current one) of job `job`:
  // FAILED_PRECONDITION naming job when there is no current plan (with
  // why); NOT_FOUND naming version when it is pruned or not yet made.
  absl::StatusOr<std::shared_ptr<const PublishedPlan>> Find(
      const std::string& job, int64_t version) const;

  // Makes `plan` the newest version and the current one (error cleared),
  // keeping at most `keep` versions.
  void Publish(std::shared_ptr<const PublishedPlan> plan, int keep);
  // Keeps a stored version as the newest (Restore).
  void Restore(PlanVersion version);

  // PlanPublisher's handshake: the membership generation the newest
  // version (or error) describes, and whether a planner is at work.
  int64_t planned_generation = 0;
  bool planning = false;

 private:
  std::deque<PlanVersion> kept_;  // oldest first
  int64_t latest_version_ = 0;
  std::string error_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_PLAN_HISTORY_H_
