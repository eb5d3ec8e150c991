// Heartbeats keep their period while a step is slow, with real processes
// (a coordinator, two CPU workers, two trainer ranks): one trainer steps
// twice the lease late, so the other's worker sits inside its step (holding
// its engine) for that long, and still no lease runs low, none expires, and
// the plan does not change.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::MixedModel;
using testing::StepScript;

constexpr int64_t kLeaseTtlMs = 1500;
constexpr int64_t kHeartbeatMs = 300;

class HeartbeatPeriodTest : public DataPlaneFixture {};

TEST_F(HeartbeatPeriodTest, LeasesStayFreshWhileAStepWaitsTwiceTheLease) {
  ASSERT_NO_FATAL_FAILURE(StartJob(
      MixedModel(), ClusterOptions{.workers = 2,
                                   .io_timeout_ms = 10000,
                                   .lease_ttl_ms = kLeaseTtlMs,
                                   .heartbeat_interval_ms = kHeartbeatMs}));
  const int64_t version = plan().version();
  std::atomic<bool> stepping{true};
  int64_t lowest_lease_ms = kLeaseTtlMs;
  int samples = 0;
  std::thread watch([&] {
    while (stepping) {
      const absl::StatusOr<v1::ListWorkersResponse> workers = ListWorkers();
      if (workers.ok()) {
        for (const v1::WorkerInfo& w : workers->workers()) {
          lowest_lease_ms = std::min(lowest_lease_ms, w.lease_remaining_ms());
        }
        ++samples;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  StepScript script;
  script.delay[1] = absl::Milliseconds(2 * kLeaseTtlMs);
  const auto outcomes = RunStep(1, script);
  stepping = false;
  watch.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(outcomes[r]->result.ok())
        << "trainer " << r << ": " << outcomes[r]->result.status();
    EXPECT_EQ(outcomes[r]->result->plan_version, version);
  }
  EXPECT_GE(outcomes[0]->elapsed, absl::Milliseconds(kLeaseTtlMs))
      << "the step was not slow";
  EXPECT_GE(samples, 10);
  // A heartbeat at least every two periods (one of slack for a loaded
  // machine): the lease never fell below the TTL minus three periods.
  EXPECT_GE(lowest_lease_ms, kLeaseTtlMs - 3 * kHeartbeatMs);
  EXPECT_FALSE(absl::StrContains(coordinator_process().Log(), "expired"));
}

}  // namespace
}  // namespace muonps
