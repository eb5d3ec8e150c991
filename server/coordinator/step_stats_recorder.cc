#include "server/coordinator/step_stats_recorder.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/coordinator/request_validation.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

// Asks for the next plan of `job` with its ranks' measured speeds when
// they call for one (SpeedBalance); true if so.
bool MaybeRebalance(const std::string& name, JobRecord& job, double tolerance) {
  const PlanVersion* newest = job.plans.newest();
  if (newest == nullptr) return false;
  const scheduler::OwnershipPlan& plan = newest->plan->ownership;
  std::vector<RankSpeed> ranks;
  for (size_t r = 0; r < plan.worker_ids.size(); ++r) {
    const WorkerRecord* w = job.members.Find(plan.worker_ids[r]);
    if (w == nullptr) return false;  // a re-plan is on its way anyway
    ranks.push_back({plan.worker_ids[r], &w->speed,
                     r < plan.worker_momentum_bytes.size() &&
                         plan.worker_momentum_bytes[r] > 0,
                     w->join.device.kind == "cuda"});
  }
  std::optional<Rebalance> rebalance =
      job.speed_balance.Consider(ranks, tolerance);
  if (!rebalance.has_value()) return false;
  spdlog::info("job={} re-plans by {}", name, rebalance->reason);
  job.members.SetMeasuredSpeeds(plan.worker_ids, rebalance->factors,
                                job.plans.latest_version() + 1,
                                std::move(rebalance->reason));
  return true;
}

}  // namespace

absl::StatusOr<bool> StepStatsRecorder::ReportStepStats(const StepReport& r) {
  const StepStats& s = r.stats;
  if (s.step < 0) return InvalidField("step", absl::StrCat(s.step, " < 0"));
  for (const auto& [value, field] :
       {std::pair<double, const char*>{s.step_seconds, "step_seconds"},
        {s.ns_seconds, "ns_seconds"},
        {s.predicted_ns_seconds, "predicted_ns_seconds"}}) {
    if (!std::isfinite(value) || value < 0) {
      return InvalidField(field, absl::StrCat(value, " must be finite, >= 0"));
    }
  }
  if (s.bytes_moved < 0) {
    return InvalidField("bytes_moved", absl::StrCat(s.bytes_moved, " < 0"));
  }
  if (s.plan_version < 0) {
    return InvalidField("plan_version", absl::StrCat(s.plan_version, " < 0"));
  }
  MUONPS_RETURN_IF_ERROR(ValidateId(r.worker_id, "worker_id"));
  absl::MutexLock lock(table_->mutex());
  MUONPS_ASSIGN_OR_RETURN(JobRecord * job, table_->Find(r.job));
  MUONPS_ASSIGN_OR_RETURN(
      WorkerRecord * worker,
      job->members.Authenticate(r.job, r.worker_id, r.worker_token,
                                r.certificate));
  if (s.plan_version > job->plans.latest_version()) {
    return InvalidField(
        "plan_version",
        absl::StrCat(s.plan_version, " is newer than the latest, ",
                     job->plans.latest_version()));
  }
  // A worker reports its steps in order; an id at or below the one held (a
  // trainer that resumed from an earlier step) leaves the newest in place.
  bool rebalanced = false;
  if (!worker->last_step.has_value() || s.step > worker->last_step->step) {
    worker->last_step = s;
    worker->speed.Add(s);
    rebalanced = MaybeRebalance(r.job, *job, rebalance_tolerance_);
  }
  job->stepped = true;
  return rebalanced;
}

}  // namespace coordinator
}  // namespace muonps
