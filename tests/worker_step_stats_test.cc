// Step stats from real processes (a coordinator, two CPU workers, two
// trainer ranks): after three steps ListWorkers shows each worker's last step
// as its trainer saw it (step seconds, bytes moved), with the compute time
// the worker measured and the prediction of the plan it ran: the sum of its
// batches' predicted seconds, as the worker sends it in ReportStepStats.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::DataPlaneFixture;
using testing::MixedModel;
using testing::StepOutcome;

constexpr int kWorkers = 2;
constexpr int64_t kSteps = 3;
// Workers send their stats after a heartbeat (every 300 ms here).
constexpr absl::Duration kReportTimeout = absl::Seconds(15);

class WorkerStepStatsTest : public DataPlaneFixture {
 protected:
  // ListWorkers of the job once every worker's last_step is step `step`
  // (a failed test after kReportTimeout).
  v1::ListWorkersResponse WaitForLastStep(int64_t step) {
    const absl::Time deadline = absl::Now() + kReportTimeout;
    v1::ListWorkersResponse workers;
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::ListWorkersResponse> listed = ListWorkers();
      workers.Clear();
      if (listed.ok()) {
        workers = *std::move(listed);
        int current = 0;
        for (const v1::WorkerInfo& w : workers.workers()) {
          current += w.has_last_step() && w.last_step().step() == step;
        }
        if (current == workers.workers_size() && current > 0) return workers;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
    ADD_FAILURE() << "no last_step of step " << step
                  << " from every worker: " << workers.DebugString();
    return workers;
  }
};

TEST_F(WorkerStepStatsTest,
       ListWorkersShowsEachWorkersLastStepBesideItsPlannedCompute) {
  ASSERT_NO_FATAL_FAILURE(StartJob(MixedModel(), {.workers = kWorkers}));
  std::vector<std::optional<StepOutcome>> last;
  for (int64_t step = 1; step <= kSteps; ++step) {
    last = RunStep(step);
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_TRUE(last[r].has_value() && last[r]->result.ok())
          << "step " << step << " trainer " << r;
    }
  }
  std::map<std::string, double> predicted;
  for (const v1::Batch& batch : plan().batches()) {
    predicted[batch.worker_id()] += batch.predicted_seconds();
  }
  const v1::ListWorkersResponse workers = WaitForLastStep(kSteps);
  ASSERT_EQ(workers.workers_size(), kWorkers);
  for (const v1::WorkerInfo& w : workers.workers()) {
    SCOPED_TRACE(w.worker_id());
    const v1::WorkerStepStats& s = w.last_step();
    const int r = WorkerIndex(w.worker_id());
    EXPECT_EQ(s.plan_version(), plan().version());
    // What the worker answered its trainer for that step.
    EXPECT_EQ(s.step_seconds(), last[r]->result->seconds);
    EXPECT_EQ(s.bytes_moved(), last[r]->result->bytes_moved);
    EXPECT_GT(s.step_seconds(), 0);
    EXPECT_GE(s.ns_seconds(), 0);
    EXPECT_LE(s.ns_seconds(), s.step_seconds());
    // Both sum the same batches' seconds in the plan's order.
    ASSERT_GT(predicted[w.worker_id()], 0) << "the plan gave it no batch";
    EXPECT_NEAR(s.predicted_ns_seconds(), predicted[w.worker_id()],
                1e-12 * predicted[w.worker_id()]);
  }
}

}  // namespace
}  // namespace muonps
