// A worker beyond the job's trainers, with real processes (a coordinator
// over TLS and tokens, two CPU workers with trainers, a third worker with
// valid credentials that no trainer attaches to and that is not
// dedicated): it is a standby. It joins and leaves with no new plan, and
// training goes on at once, bit-identical to a run without it. When a
// rank is lost for good the standby takes its place; when that rank's
// worker comes back and its trainer asks for it, it is ranked again in
// place of the standby, and training goes on.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using testing::ChildProcess;
using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::LoopOutcome;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::RetryingLoop;

constexpr int kWorkers = 2;
constexpr double kExact = 0;

class StandbyWorkerTest : public DataPlaneFixture {
 protected:
  // Waits until the coordinator lists `id` as a member, standby or not.
  absl::Status WaitForMember(const std::string& id, bool standby,
                             absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string last;
    while (absl::Now() < deadline) {
      const absl::StatusOr<v1::ListWorkersResponse> listed = ListWorkers();
      last =
          listed.ok() ? listed->ShortDebugString() : listed.status().ToString();
      for (int i = 0; listed.ok() && i < listed->workers_size(); ++i) {
        const v1::WorkerInfo& w = listed->workers(i);
        if (w.worker_id() == id && w.standby() == standby) {
          return absl::OkStatus();
        }
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::DeadlineExceededError(
        absl::StrCat(id, " is not listed",
                     standby ? " as a standby" : " as a rank", ": ", last));
  }

  // Waits until the latest plan ranks exactly `ids`, in order.
  absl::Status WaitForRanks(const std::vector<std::string>& ids,
                            absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string last;
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::Plan> plan = LatestPlan();
      if (plan.ok() && std::vector<std::string>(plan->workers().begin(),
                                                plan->workers().end()) == ids) {
        return absl::OkStatus();
      }
      last = plan.ok() ? plan->ShortDebugString().substr(0, 300)
                       : plan.status().ToString();
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::DeadlineExceededError(absl::StrCat("latest plan: ", last));
  }

  const ModelDecl model_ = MixedModel();
};

TEST_F(StandbyWorkerTest, AStrayWorkerHoldsUpNoStep) {
  ASSERT_NO_FATAL_FAILURE(StartJob(model_, {.workers = kWorkers}));
  ReferenceModel reference(model_, kWorkers, PlannedAlgorithms());
  for (int64_t step = 1; step <= 3; ++step) {
    for (const auto& o : RunStep(step)) {
      ASSERT_TRUE(o.has_value() && o->result.ok()) << o->result.status();
    }
  }
  const int64_t version = plan().version();
  std::unique_ptr<ChildProcess> stray = StartStandbyWorker("stray");
  ASSERT_NE(stray, nullptr);
  const absl::Status listed =
      WaitForMember("stray", /*standby=*/true, absl::Seconds(20));
  ASSERT_TRUE(listed.ok()) << listed << "\n" << stray->Log();
  // Every step answered at its first call, under the same plan.
  const std::vector<LoopOutcome> loops = RunTrainerLoops(4, 23, 1);
  for (int r = 0; r < trainers(); ++r) {
    ASSERT_TRUE(loops[r].finished)
        << "trainer " << r << ": " << loops[r].attempts.back().result.status()
        << "\n"
        << stray->Log();
  }
  absl::StatusOr<v1::Plan> latest = LatestPlan();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->version(), version);
  // It leaves (SIGTERM) with no new plan either, and training goes on.
  stray->Signal(SIGTERM);
  const absl::StatusOr<int> exited = stray->Wait(absl::Seconds(30));
  ASSERT_TRUE(exited.ok()) << exited.status() << "\n" << stray->Log();
  for (const LoopOutcome& loop : RunTrainerLoops(24, 25, 1)) {
    EXPECT_TRUE(loop.finished) << loop.attempts.back().result.status();
  }
  latest = LatestPlan();
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->version(), version);
  for (int64_t step = 1; step <= 25; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
  }
  ExpectMatchesReference(reference, kExact);
}

TEST_F(StandbyWorkerTest, AStandbyStandsInForALostRankUntilItsTrainerReturns) {
  ASSERT_NO_FATAL_FAILURE(StartJob(model_, {.workers = kWorkers,
                                            .lease_ttl_ms = 1500,
                                            .heartbeat_interval_ms = 200,
                                            // w1's momentum is in no
                                            // checkpoint.
                                            .allow_momentum_reset = true}));
  for (const LoopOutcome& loop : RunTrainerLoops(1, 3, 1)) {
    ASSERT_TRUE(loop.finished) << loop.attempts.back().result.status();
  }
  std::unique_ptr<ChildProcess> spare = StartStandbyWorker("spare");
  ASSERT_NE(spare, nullptr);
  absl::Status waited =
      WaitForMember("spare", /*standby=*/true, absl::Seconds(20));
  ASSERT_TRUE(waited.ok()) << waited;
  // w1 is lost for good: once its lease runs out the spare is ranked.
  ASSERT_NO_FATAL_FAILURE(KillWorker(1));
  waited = WaitForRanks({"w0", "spare"}, absl::Seconds(20));
  ASSERT_TRUE(waited.ok()) << waited;
  // w1 comes back, a standby now (the spare is ranked); trainer 1 steps
  // on it, the heartbeat says so, and w1 is ranked in place of the spare,
  // which has no trainer. Both trainers' retries then finish the steps.
  ASSERT_NO_FATAL_FAILURE(RestartWorker(1));
  const std::vector<RetryingLoop> loops =
      RunRetryingLoops(4, 8, nullptr, absl::Seconds(60));
  for (int r = 0; r < trainers(); ++r) {
    EXPECT_TRUE(loops[r].finished)
        << "trainer " << r << " stopped after step " << loops[r].last_done
        << ": " << loops[r].last_failure << "\n"
        << spare->Log();
  }
  waited = WaitForRanks({"w0", "w1"}, absl::Seconds(5));
  EXPECT_TRUE(waited.ok()) << waited;
  waited = WaitForMember("spare", /*standby=*/true, absl::Seconds(5));
  EXPECT_TRUE(waited.ok()) << waited;
}

}  // namespace
}  // namespace muonps
