// StepStatsRecorder: the step stats workers report after each step. The
// newest step of each worker (by step id) is kept in its member record,
// where ListWorkers shows it beside the plan's prediction; a report also
// marks the job as stepped (its momentum may exist, so re-plans keep
// owners: JobRecord::stepped), and measures the worker's speed
// (MeasuredSpeed). When the ranks of the job's newest plan measure
// unequal beyond the tolerance (RebalanceByMeasurement), their speeds go
// into the next plan, which the lease monitor makes (as it does for a
// heartbeat's change). In memory only: the stats and speeds go with the
// record when the worker leaves, its lease expires or a new instance takes
// its id over.
//
// Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_STEP_STATS_RECORDER_H_
#define MUONPS_SERVER_COORDINATOR_STEP_STATS_RECORDER_H_

#include <string>

#include "absl/status/status.h"
#include "server/coordinator/job_table.h"
#include "server/coordinator/worker_types.h"

namespace muonps {
namespace coordinator {

struct StepReport {
  std::string job;
  std::string worker_id;
  std::string worker_token;
  std::string certificate;  // the call's (JoinRequest::certificate)
  StepStats stats;
};

class StepStatsRecorder {
 public:
  // `table` must outlive the recorder. `rebalance_tolerance`: see
  // RebalanceByMeasurement (<= 0: plans never use measured speeds).
  StepStatsRecorder(JobTable* table, double rebalance_tolerance)
      : table_(table), rebalance_tolerance_(rebalance_tolerance) {}
  StepStatsRecorder(const StepStatsRecorder&) = delete;
  StepStatsRecorder& operator=(const StepStatsRecorder&) = delete;

  // Keeps the report's stats in the worker's record when its step id is
  // above the one held there (an older or repeated step id changes
  // nothing, and is still OK). Never waits on planning or the store. True
  // when the report asked for a plan with measured speeds.
  // INVALID_ARGUMENT naming the field (a negative or non-finite number, a
  // plan_version above the job's latest); NOT_FOUND (job or worker);
  // UNAUTHENTICATED (worker_token).
  absl::StatusOr<bool> ReportStepStats(const StepReport& report);

 private:
  JobTable* const table_;
  const double rebalance_tolerance_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_STEP_STATS_RECORDER_H_
