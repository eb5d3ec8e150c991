// What a step reports about itself: each worker's compute time (from its
// marks) beside the plan's prediction of it, the pair behind the
// muonps_worker_step_compute_seconds gauges and the benches' cost-model
// lines.
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "server/worker/step_engine_fixture.h"

namespace muonps {
namespace worker {
namespace {

TEST_F(StepEngineTest, StepReportsItsComputeTimeBesideThePlansPrediction) {
  ASSERT_NO_FATAL_FAILURE(
      SetPlanEverywhere(PairOnW0({{2, v1::NS_ALGORITHM_NS5}}, 0.25)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  for (int64_t step = 0; step < 3; ++step) {
    WriteGradients(step);
    const std::vector<absl::StatusOr<StepResponse>> got = StepEverywhere(step);
    for (int w = 0; w < kWorkers; ++w) {
      ASSERT_TRUE(got[w].ok()) << w << ": " << got[w].status();
      const StepResponse& r = *got[w];
      // Every worker owns a stack here, so its compute stream was busy,
      // within the step's wall time.
      EXPECT_GT(r.ns_seconds, 0) << w;
      EXPECT_LE(r.ns_seconds, r.seconds) << w;
      // Only w0's batch carries a prediction.
      EXPECT_EQ(r.predicted_ns_seconds, w == 0 ? 0.25 : 0.0) << w;
    }
  }
}

}  // namespace
}  // namespace worker
}  // namespace muonps
