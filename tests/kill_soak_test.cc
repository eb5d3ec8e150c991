// Random kills with real processes: a coordinator, two CPU workers and two
// trainer ranks step a model of every layout, with a momentum checkpoint
// every step and the strict default (no momentum may reset). While the
// trainers' loops retry as a user's does, a seeded random worker is killed
// (kill -9) at a random moment 50 times and restarted at once, and 10 times
// frozen (SIGSTOP) past its lease and let go. The run must finish every
// step, and end bit-identical to a failure-free replay: parameters, AdamW
// and momentum. Every failed call said "retry".
//
// A kill lands anywhere in a step: before the exchange (the step redoes),
// between rank 0's commit and the victim's (the victim's trainer is
// repaired from the other's: step_protocol.h's kRepair), after the victim's
// commit (its trainer's step record says so), or while the victim writes
// the parameters, or while an owner writes its updates into the other
// trainer's staging. The trainers keep whole parameters, so they lend their
// staging to the other worker (peer writes); a trainer that keeps only its
// rows of a row-sharded matrix cannot be repaired (step_chaos_test's
// StepChaosRowsTest).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::LoopProgress;
using testing::ReferenceModel;
using testing::RetryingLoop;

constexpr int kWorkers = 2;
constexpr int kKills = 50;
constexpr int kFreezes = 10;
constexpr int64_t kLeaseMs = 1500;
// Steps between failures: every failure lands in a run that stepped since
// the one before. The trainers step until the last failure is over, then
// kWarmUp more (LoopProgress::EndAfter): a recovery may move them on by
// several steps, so how many they take in all is not known before.
constexpr int64_t kWarmUp = 10;
constexpr int64_t kStepsBetween = 3;
constexpr int64_t kMostSteps = 10 * (kKills + kFreezes) * kStepsBetween;
// The service and the replay run the same fp32 kernels in the same order.
constexpr double kExact = 0;

class KillSoakTest : public DataPlaneFixture {};

TEST_F(KillSoakTest, FiftyKillsAndTenFreezesEndBitIdentical) {
  const absl::Time start = absl::Now();
  testing::ModelDecl model = testing::MixedModel();
  for (testing::MatrixDecl& m : model.matrices) m.options.shard_params = false;
  ClusterOptions options{.workers = kWorkers,
                         .io_timeout_ms = 1000,
                         .lease_ttl_ms = kLeaseMs,
                         .heartbeat_interval_ms = 200};
  options.checkpoint_dir = testing::NewTempDir("kill-soak-checkpoints");
  options.checkpoint_every = 1;
  ASSERT_NO_FATAL_FAILURE(StartJob(model, options));

  const uint32_t seed = std::random_device()();
  std::cerr << "seed " << seed << "\n";
  std::mt19937 random(seed);
  LoopProgress progress(trainers());
  // Every trainer's matrices after every step it was answered, to name the
  // first step off the replay when the end differs.
  std::vector<std::map<int64_t, std::vector<float>>> trajectory(trainers());
  auto record = [&](int rank, int64_t step) {
    std::vector<float>& flat = trajectory[rank][step];
    for (const testing::MatrixDecl& m : model.matrices) {
      const TensorBuffers b = Buffers(rank, m.name);
      flat.insert(flat.end(), b.param, b.param + b.param_elements);
    }
  };
  std::vector<RetryingLoop> loops;
  std::thread trainers_thread([&] {
    loops =
        RunRetryingLoops(1, kMostSteps, &progress, absl::Seconds(60), record);
  });
  std::vector<std::string> events;  // failures injected, with their time
  // Kills, with a freeze in place of every sixth.
  int kills = 0, freezes = 0;
  // Every trainer finished a step after the failure before: each lands on a
  // job that recovered from the last (checkpoint_test kills two workers
  // within one step).
  int64_t recovered = 0;
  for (int event = 0; kills < kKills || freezes < kFreezes; ++event) {
    if (!progress.WaitFor(
            std::max(kWarmUp + event * kStepsBetween, recovered + 1),
            absl::Seconds(90))) {
      break;  // the trainers stalled: reported below
    }
    const int victim = static_cast<int>(random() % kWorkers);
    absl::SleepFor(absl::Microseconds(random() % 20000));
    const bool freeze =
        freezes < kFreezes && (event % 6 == 5 || kills == kKills);
    events.push_back(absl::StrCat(absl::FormatTime(absl::Now()), ": ",
                                  freeze ? "freeze" : "kill", " w", victim,
                                  " after step ", progress.Slowest()));
    if (freeze) {
      SignalWorker(victim, SIGSTOP);
      absl::SleepFor(absl::Milliseconds(kLeaseMs + 700));
      SignalWorker(victim, SIGCONT);
      ++freezes;
    } else {
      ASSERT_NO_FATAL_FAILURE(KillWorker(victim));
      ASSERT_NO_FATAL_FAILURE(RestartWorker(victim));
      ++kills;
    }
    recovered = progress.Slowest();
  }
  const int64_t last = progress.EndAfter(kWarmUp);
  trainers_thread.join();
  std::cerr << kills << " kills and " << freezes << " freezes in "
            << absl::Now() - start << ", " << last << " steps\n";
  EXPECT_EQ(kills, kKills) << "training stalled at step " << progress.Slowest();
  EXPECT_EQ(freezes, kFreezes);
  std::map<absl::StatusCode, int> failures;
  std::map<absl::StatusCode, std::string> first;
  for (int r = 0; r < trainers(); ++r) {
    EXPECT_TRUE(loops[r].finished)
        << "trainer " << r << " stopped after step " << loops[r].last_done
        << ": " << loops[r].last_failure;
    EXPECT_EQ(loops[r].resets, 0) << "trainer " << r;
    first.insert(loops[r].first.begin(), loops[r].first.end());
    for (const auto& [code, count] : loops[r].failures) failures[code] += count;
  }
  std::cerr << "failed attempts, each retried:";
  for (const auto& [code, count] : failures) {
    std::cerr << " " << absl::StatusCodeToString(code) << " x" << count;
  }
  std::cerr << "\n";
  for (const auto& [code, count] : failures) {
    EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
                code == absl::StatusCode::kAborted ||
                code == absl::StatusCode::kDeadlineExceeded)
        << absl::StatusCodeToString(code) << " x" << count << ": "
        << first[code];
  }
  ASSERT_TRUE(loops[0].finished && loops[1].finished);
  ReferenceModel reference(model, kWorkers, PlannedAlgorithms());
  int64_t first_off = 0;  // the first step a trainer's matrices left the replay
  ASSERT_EQ(loops[0].last_done, last);
  for (int64_t step = 1; step <= last; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
    std::vector<float> expected;
    for (const testing::MatrixDecl& m : model.matrices) {
      const std::vector<float>& full = reference.param(m.name);
      expected.insert(expected.end(), full.begin(), full.end());
    }
    for (int r = 0; r < trainers() && first_off == 0; ++r) {
      if (trajectory[r][step] != expected) first_off = step;
    }
  }
  if (first_off != 0) {
    ADD_FAILURE() << "the trainers' matrices left the replay at step "
                  << first_off;
    std::cerr << "failures injected:\n";
    for (const std::string& e : events) std::cerr << "  " << e << "\n";
    for (int r = 0; r < trainers(); ++r) {
      std::cerr << "trainer " << r << "'s failed attempts:\n";
      for (const std::string& a : loops[r].attempts) {
        std::cerr << "  " << a << "\n";
      }
    }
  }
  const absl::Status planned = WaitForFullPlan(absl::Seconds(30));
  ASSERT_TRUE(planned.ok()) << planned;
  ExpectMatchesReference(reference, kExact);
  // Every trainer keeps its parameters whole, so the owners wrote their
  // updates into the peers' staging throughout, also after each restart.
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_NE(WorkerLog(w).find(
                  "2 of 2 workers write updates into the trainers' staging"),
              std::string::npos)
        << "worker " << w;
  }
}

}  // namespace
}  // namespace muonps
