// A worker asked to leave (SIGTERM) drains, with real processes (a
// coordinator, CPU workers over TCP, trainers' clients that retry as a
// training loop does): it becomes a rank that owns nothing, the next step
// hands its momentum to the new owners, then it leaves. A rolling restart of
// every worker, one at a time, during training therefore fails no step for
// good, resets no momentum (the job is strict and keeps no checkpoints),
// and ends bit-identical to a run without restarts. A drain while the
// trainers are idle (no step comes to carry the handover) persists the
// momentum the worker holds into the job's checkpoint of its last step
// when its --drain_timeout ends, and the new owners take it from there.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::LoopProgress;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::RetryingLoop;

constexpr int kWorkers = 3;
constexpr int64_t kSteps = 300;
// The service and the replay run the same fp32 kernels in the same order.
constexpr double kExact = 0;

class WorkerDrainTest : public DataPlaneFixture {
 protected:
  // Every trainer runs steps [1, kSteps] as a user's loop does.
  std::vector<RetryingLoop> RunLoops(LoopProgress* progress) {
    return RunRetryingLoops(1, kSteps, progress);
  }

  // The job on kWorkers CPU workers, as every test here runs it.
  void StartCluster() {
    ASSERT_NO_FATAL_FAILURE(StartJob(model_, {.workers = kWorkers,
                                              .io_timeout_ms = 5000,
                                              .lease_ttl_ms = 3000,
                                              .heartbeat_interval_ms = 200}));
  }

  // Steps once more under the plan every worker follows once the last one
  // is made, replays kSteps + 1 in `reference`, and expects every trainer's
  // parameters and every owner's momentum (read from the owners of that
  // plan) equal to it, bit for bit. (A plan made after the loops' last step,
  // once a restarted worker's trainer rank is heard, hands the momentum to
  // its new owners with its first step.)
  void ExpectEqualToTheReplay(ReferenceModel& reference) {
    absl::Status planned = WaitForFullPlan(absl::Seconds(20));
    ASSERT_TRUE(planned.ok()) << planned;
    const std::vector<testing::LoopOutcome> last =
        RunTrainerLoops(kSteps + 1, kSteps + 1, 20);
    for (size_t r = 0; r < last.size(); ++r) {
      ASSERT_TRUE(last[r].finished)
          << "trainer " << r << ": " << last[r].attempts.back().result.status();
    }
    for (int64_t step = 1; step <= kSteps + 1; ++step) {
      ASSERT_TRUE(reference.Step(step).ok());
    }
    planned = WaitForFullPlan(absl::Seconds(20));
    ASSERT_TRUE(planned.ok()) << planned;
    ExpectMatchesReference(reference, kExact);
  }

  ModelDecl model_ = MixedModel();
};

// The rolling restart, of the mixed model and of one whose trainers hold
// whole experts (FSDP2's expert stacks): the plan of that job owns experts
// where they are held, so each drain and restart moves it to other owners
// and back once the restarted worker's trainer rank is known again.
class WorkerRollingRestartTest : public WorkerDrainTest,
                                 public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    WorkerDrainTest::SetUp();
    if (GetParam()) {
      model_ = testing::SmallModel(scheduler::Layout::kRowSharded,
                                   /*shard_params=*/true,
                                   /*shard_experts=*/true);
    }
  }
};

TEST_P(WorkerRollingRestartTest, ARollingRestartOfEveryWorkerLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ReferenceModel reference(model_, kWorkers, PlannedAlgorithms());
  LoopProgress done(trainers());
  std::vector<RetryingLoop> loops;
  std::thread trainers_thread([&] { loops = RunLoops(&done); });
  std::vector<int64_t> restarted_at;
  for (int w = 0; w < kWorkers; ++w) {
    const int64_t at = 40 + 80 * w;
    if (!done.WaitFor(at, absl::Seconds(120))) break;
    restarted_at.push_back(done.Slowest());
    SignalWorker(w, SIGTERM);
    const absl::StatusOr<int> exited = WaitForWorkerExit(w, absl::Seconds(30));
    ASSERT_TRUE(exited.ok())
        << "worker " << w << " did not exit: " << exited.status() << "\n"
        << WorkerLog(w);
    EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0)
        << "worker " << w << ": " << *exited;
    EXPECT_TRUE(absl::StrContains(WorkerLog(w), "drained: step"))
        << "worker " << w << " left without handing over:\n"
        << WorkerLog(w);
    ASSERT_NO_FATAL_FAILURE(RestartWorker(w));
  }
  trainers_thread.join();
  ASSERT_EQ(restarted_at.size(), static_cast<size_t>(kWorkers))
      << "training stalled at step " << done.Slowest();
  int64_t resets = 0;
  std::map<absl::StatusCode, int> failures;
  std::map<absl::StatusCode, std::string> first;
  for (int r = 0; r < trainers(); ++r) {
    first.insert(loops[r].first.begin(), loops[r].first.end());
    EXPECT_TRUE(loops[r].finished)
        << "trainer " << r << " stopped after step " << loops[r].last_done
        << ": " << loops[r].last_failure;
    resets += loops[r].resets;
    for (const auto& [code, count] : loops[r].failures) failures[code] += count;
  }
  std::cerr << "restarted workers at steps";
  for (const int64_t s : restarted_at) std::cerr << " " << s;
  std::cerr << "; failed attempts, each retried:";
  for (const auto& [code, count] : failures) {
    std::cerr << " " << absl::StatusCodeToString(code) << " x" << count;
  }
  std::cerr << "\n";
  for (const auto& [code, message] : first) {
    std::cerr << "  first " << absl::StatusCodeToString(code) << ": " << message
              << "\n";
  }
  EXPECT_EQ(resets, 0);
  // Every failure said "retry" (the README's failure table).
  for (const auto& [code, count] : failures) {
    EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
                code == absl::StatusCode::kAborted ||
                code == absl::StatusCode::kDeadlineExceeded)
        << absl::StatusCodeToString(code) << " x" << count << ": "
        << first[code];
  }
  ASSERT_NO_FATAL_FAILURE(ExpectEqualToTheReplay(reference));
  if (GetParam()) {
    // The last plan knew every trainer's shard again (WaitForFullPlan waits
    // for it) and left experts with their holders.
    EXPECT_GT(ExpertsOwnedByHolders(plan()), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, WorkerRollingRestartTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WholeExperts" : "Mixed";
                         });

// An operator's drain (DrainWorker, as `muonps drain` sends it) reaches
// the worker by its heartbeat: it drains as on SIGTERM and exits 0; started
// again, it takes its share back, and the run ends bit-identical to one
// without the drain.
TEST_F(WorkerDrainTest, AnOperatorsDrainMovesTheMomentumAndTheWorkerExits) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ReferenceModel reference(model_, kWorkers, PlannedAlgorithms());
  LoopProgress done(trainers());
  std::vector<RetryingLoop> loops;
  std::thread trainers_thread([&] { loops = RunLoops(&done); });
  bool drained = done.WaitFor(60, absl::Seconds(120));
  if (drained) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::DrainWorkerRequest request;
    request.set_job(job());
    request.set_worker_id("w1");
    v1::DrainWorkerResponse response;
    const grpc::Status status =
        coordinator_stub().DrainWorker(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    const absl::StatusOr<int> exited = WaitForWorkerExit(1, absl::Seconds(30));
    drained = exited.ok();
    EXPECT_TRUE(exited.ok()) << "w1 did not exit: " << exited.status() << "\n"
                             << WorkerLog(1);
    if (exited.ok()) {
      EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << *exited;
      EXPECT_TRUE(absl::StrContains(WorkerLog(1), "the coordinator says"))
          << WorkerLog(1);
      EXPECT_TRUE(absl::StrContains(WorkerLog(1), "drained: step"))
          << WorkerLog(1);
      RestartWorker(1);
    }
  }
  trainers_thread.join();
  ASSERT_TRUE(drained);
  for (int r = 0; r < trainers(); ++r) {
    EXPECT_TRUE(loops[r].finished)
        << "trainer " << r << " stopped after step " << loops[r].last_done
        << ": " << loops[r].last_failure;
    EXPECT_EQ(loops[r].resets, 0) << "trainer " << r;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectEqualToTheReplay(reference));
}

// A pool scaled down: a dedicated worker (no trainer) that owns matrices
// is stopped for good (SIGTERM). It drains, handing its matrices back to
// the trainers' workers, and training goes on without it: no step fails
// for good, no momentum resets, bit-identical to a run without the pool.
TEST_F(WorkerDrainTest, ScalingThePoolDownHandsItsMomentumBack) {
  ASSERT_NO_FATAL_FAILURE(StartCluster());
  ReferenceModel reference(model_, kWorkers, PlannedAlgorithms());
  ASSERT_NO_FATAL_FAILURE(JoinDedicatedWorker());
  const absl::Status joined = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(joined.ok()) << joined;
  int owned = 0;
  for (const testing::MatrixDecl& m : model_.matrices) {
    for (int64_t e = 0; e < m.options.experts; ++e) {
      owned += Owner(m.name, e) == kWorkers;
    }
  }
  ASSERT_GT(owned, 0) << "the plan gave the pool worker nothing";
  LoopProgress done(trainers());
  std::vector<RetryingLoop> loops;
  std::thread trainers_thread([&] { loops = RunLoops(&done); });
  bool left = done.WaitFor(60, absl::Seconds(120));
  if (left) {
    SignalWorker(kWorkers, SIGTERM);
    const absl::StatusOr<int> exited =
        WaitForWorkerExit(kWorkers, absl::Seconds(30));
    left = exited.ok();
    EXPECT_TRUE(exited.ok())
        << "the pool worker did not exit: " << exited.status() << "\n"
        << WorkerLog(kWorkers);
    EXPECT_TRUE(absl::StrContains(WorkerLog(kWorkers), "drained: step"))
        << WorkerLog(kWorkers);
    if (exited.ok()) ForgetLastWorker();
  }
  trainers_thread.join();
  ASSERT_TRUE(left);
  std::cerr << "the pool worker owned " << owned << " matrices\n";
  for (int r = 0; r < trainers(); ++r) {
    EXPECT_TRUE(loops[r].finished)
        << "trainer " << r << " stopped after step " << loops[r].last_done
        << ": " << loops[r].last_failure;
    EXPECT_EQ(loops[r].resets, 0) << "trainer " << r;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectEqualToTheReplay(reference));
}

// The trainers pause (an evaluation, say) while worker w1 is stopped: no
// step comes before its drain ends, so what it owned goes to the job's
// checkpoint of step 3 (the job writes checkpoints only when asked), and
// once it is back the steps go on, strict, with nothing reset.
TEST_F(WorkerDrainTest, AnIdleDrainPersistsTheMomentumItHolds) {
  const std::string checkpoints = testing::NewTempDir("idle-drain");
  ASSERT_NO_FATAL_FAILURE(
      StartJob(model_, {.workers = kWorkers,
                        .io_timeout_ms = 5000,
                        .lease_ttl_ms = 3000,
                        .heartbeat_interval_ms = 200,
                        .worker_flags = {{1, {"--drain_timeout=1s"}}},
                        .checkpoint_dir = checkpoints,
                        .checkpoint_every = 0}));
  ReferenceModel reference(model_, kWorkers, PlannedAlgorithms());
  int owned = 0;
  for (const testing::MatrixDecl& m : model_.matrices) {
    for (int64_t e = 0; e < m.options.experts; ++e)
      owned += Owner(m.name, e) == 1;
  }
  ASSERT_GT(owned, 0) << "the plan gave w1 nothing";
  for (int64_t step = 1; step <= 3; ++step) {
    for (const auto& o : RunStep(step)) {
      ASSERT_TRUE(o.has_value() && o->result.ok())
          << "step " << step << ": " << o->result.status();
    }
    ASSERT_TRUE(reference.Step(step).ok());
  }
  SignalWorker(1, SIGTERM);
  const absl::StatusOr<int> exited = WaitForWorkerExit(1, absl::Seconds(30));
  ASSERT_TRUE(exited.ok()) << exited.status() << "\n" << WorkerLog(1);
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << *exited;
  EXPECT_TRUE(absl::StrContains(
      WorkerLog(1), absl::StrCat("persisted the momentum of ", owned,
                                 " matrices as of step 3")))
      << WorkerLog(1);
  RestartWorker(1);
  const std::vector<RetryingLoop> loops =
      RunRetryingLoops(4, 6, nullptr, absl::Seconds(60));
  for (int r = 0; r < trainers(); ++r) {
    EXPECT_TRUE(loops[r].finished)
        << "trainer " << r << " stopped after step " << loops[r].last_done
        << ": " << loops[r].last_failure;
    EXPECT_EQ(loops[r].resets, 0) << "trainer " << r;
  }
  for (int64_t step = 4; step <= 6; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
  }
  ASSERT_TRUE(WaitForFullPlan(absl::Seconds(20)).ok());
  ExpectMatchesReference(reference, kExact);
}

}  // namespace
}  // namespace muonps
