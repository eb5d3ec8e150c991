// The coordinator killed (kill -9) and restarted on its --state_dir at 20
// random moments of a run, while trainers stop and start again (a new
// client in place of the old one, given what the old one had after its
// last answered step, as a restarted trainer process reloads it), with
// real processes (a coordinator over TLS and tokens, two CPU workers, two
// trainer ranks that retry as a user's loop does). Every Start succeeds
// within the client's timeout, also while the coordinator is down; no step
// fails but with a retried UNAVAILABLE, DEADLINE_EXCEEDED or ABORTED; and
// the run ends bit-identical to a failure-free replay (parameters, AdamW
// and momentum).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::DataPlaneFixture;
using testing::LoopProgress;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::RetryingLoop;

constexpr int kWorkers = 2;
constexpr int64_t kSteps = 600;
constexpr int kCoordinatorRestarts = 20;
constexpr absl::Duration kClientTimeout = absl::Seconds(30);
constexpr double kExact = 0;

class CoordinatorRestartSoakTest : public DataPlaneFixture {
 protected:
  const ModelDecl model_ = MixedModel();
};

TEST_F(CoordinatorRestartSoakTest,
       TwentyRestartsWhileTrainersStopAndStartLoseNothing) {
  ASSERT_NO_FATAL_FAILURE(StartJob(
      model_, {.workers = kWorkers,
               .io_timeout_ms = 3000,
               .lease_ttl_ms = 3000,
               .heartbeat_interval_ms = 300,
               .client_timeout = kClientTimeout,
               .state_dir = testing::NewTempDir("coordinator_state")}));
  ReferenceModel reference(model_, kWorkers, PlannedAlgorithms());
  const uint32_t seed = std::random_device()();
  std::cerr << "seed " << seed << "\n";
  std::mt19937 random(seed);
  // Each trainer restarts 10 times, at steps of its own: 20 restarted
  // trainers.
  std::vector<std::vector<int64_t>> restart_after(kWorkers);
  for (int r = 0; r < kWorkers; ++r) {
    for (int64_t s = 10 + 29 * r; s < kSteps; s += 58) {
      restart_after[r].push_back(s);
    }
  }
  std::mutex mu;
  std::vector<std::string> start_failures;
  std::vector<absl::Duration> start_times;
  std::atomic<bool> coordinator_down{false};
  int starts_while_down = 0;
  LoopProgress done(kWorkers);
  std::vector<RetryingLoop> loops;
  std::thread trainers([&] {
    loops = RunRetryingLoops(
        1, kSteps, &done, absl::Seconds(90), [&](int r, int64_t step) {
          // The forward and backward of the next step.
          absl::SleepFor(absl::Milliseconds(30));
          const auto& at = restart_after[r];
          if (std::find(at.begin(), at.end(), step) == at.end()) return;
          const bool down = coordinator_down.load();
          const absl::Time start = absl::Now();
          const absl::Status started = RestartTrainer(r);
          std::lock_guard<std::mutex> lock(mu);
          start_times.push_back(absl::Now() - start);
          starts_while_down += down ? 1 : 0;
          if (!started.ok()) {
            start_failures.push_back(absl::StrCat(
                "trainer ", r, " after step ", step, ": ", started.ToString()));
          }
        });
  });
  // The restarts, each once every trainer stepped since the one before,
  // down for 0.2-1.2 s (steps go on meanwhile).
  int restarts = 0;
  for (; restarts < kCoordinatorRestarts; ++restarts) {
    const int64_t at = done.Slowest() + 1;
    if (at >= kSteps || !done.WaitFor(at, absl::Seconds(120))) break;
    absl::SleepFor(absl::Milliseconds(random() % 200));
    // A failure stops the restarts; the trainers' thread is still joined.
    KillCoordinator();
    if (HasFatalFailure()) break;
    coordinator_down.store(true);
    absl::SleepFor(absl::Milliseconds(200 + random() % 1000));
    RestartCoordinator();
    coordinator_down.store(false);
    if (HasFatalFailure()) break;
  }
  trainers.join();
  EXPECT_EQ(restarts, kCoordinatorRestarts)
      << "training stalled at step " << done.Slowest();
  EXPECT_TRUE(start_failures.empty())
      << start_failures.size()
      << " Starts failed, first: " << start_failures.front();
  absl::Duration slowest_start;
  for (const absl::Duration d : start_times) {
    slowest_start = std::max(slowest_start, d);
  }
  EXPECT_LT(slowest_start, kClientTimeout);
  std::map<absl::StatusCode, int> failures;
  int64_t resets = 0;
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_TRUE(loops[r].finished)
        << "trainer " << r << " stopped after step " << loops[r].last_done
        << ": " << loops[r].last_failure;
    resets += loops[r].resets;
    for (const auto& [code, count] : loops[r].failures) {
      failures[code] += count;
      EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
                  code == absl::StatusCode::kDeadlineExceeded ||
                  code == absl::StatusCode::kAborted)
          << "trainer " << r << ": " << count << " x "
          << absl::StatusCodeToString(code)
          << ", first: " << loops[r].first[code];
    }
  }
  EXPECT_EQ(resets, 0);
  std::cerr << restarts << " coordinator restarts, " << start_times.size()
            << " trainer restarts (" << starts_while_down
            << " begun while the coordinator was down, slowest Start "
            << slowest_start << "); failed attempts, each retried:";
  for (const auto& [code, count] : failures) {
    std::cerr << " " << absl::StatusCodeToString(code) << " x" << count;
  }
  std::cerr << "\n";
  for (int64_t step = 1; step <= kSteps; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
  }
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  ExpectMatchesReference(reference, kExact);
}

}  // namespace
}  // namespace muonps
