// StepStatsRecorder: the step stats workers report after each step. The
// newest step of each worker (by step id) is kept in its member record,
// where ListWorkers shows it beside the plan's prediction; a report also
// marks the job as stepped (its momentum may exist, so re-plans keep
// owners: JobRecord::stepped). In memory only: the stats go with the
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
  // `table` must outlive the recorder.
  explicit StepStatsRecorder(JobTable* table) : table_(table) {}
  StepStatsRecorder(const StepStatsRecorder&) = delete;
  StepStatsRecorder& operator=(const StepStatsRecorder&) = delete;

  // Keeps the report's stats in the worker's record when its step id is
  // above the one held there (an older or repeated step id changes
  // nothing, and is still OK). Never waits on planning or the store.
  // INVALID_ARGUMENT naming the field (a negative or non-finite number, a
  // plan_version above the job's latest); NOT_FOUND (job or worker);
  // UNAUTHENTICATED (worker_token).
  absl::Status ReportStepStats(const StepReport& report);

 private:
  JobTable* const table_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_STEP_STATS_RECORDER_H_
