// Momentum moves with ownership, with real processes (a coordinator, CPU
// workers over TCP, trainers' clients): a worker that joins takes over
// matrices with their momentum and training goes on as if nothing had
// moved; a killed worker's matrices have no momentum to hand over, which
// fails the next step naming a matrix unless the job allows a reset
// (server/worker/momentum_handover.h).
#include <gtest/gtest.h>
#include <signal.h>

#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::LoopOutcome;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::StepOutcome;

constexpr int kWorkers = 2;
// The service and the replay run the same fp32 kernels in the same order.
constexpr double kExact = 0;

class MomentumHandoverProcessTest : public DataPlaneFixture {
 protected:
  void StartAndStep(bool allow_reset, int64_t steps) {
    ClusterOptions cluster = {.workers = kWorkers,
                              .io_timeout_ms = 5000,
                              .lease_ttl_ms = 1500,
                              .heartbeat_interval_ms = 200,
                              .allow_momentum_reset = allow_reset};
    cluster.checkpoint_dir = checkpoint_dir_;
    cluster.checkpoint_every = checkpoint_dir_.empty() ? 0 : 1;
    ASSERT_NO_FATAL_FAILURE(StartJob(model_, cluster));
    reference_.emplace(model_, kWorkers, PlannedAlgorithms());
    for (int64_t step = 1; step <= steps; ++step) {
      for (const auto& o : RunStep(step)) {
        ASSERT_TRUE(o.has_value() && o->result.ok()) << o->result.status();
      }
      ASSERT_TRUE(reference_->Step(step).ok());
    }
  }
  std::set<std::pair<std::string, int64_t>> OwnedBy(int worker) const {
    std::set<std::pair<std::string, int64_t>> out;
    for (const testing::MatrixDecl& m : model_.matrices) {
      for (int64_t e = 0; e < m.options.experts; ++e) {
        if (Owner(m.name, e) == worker) out.insert({m.name, e});
      }
    }
    return out;
  }
  // Every trainer's loop finished; `*resets` adds up the momentum_reset of
  // its answered attempts.
  void ExpectFinished(const std::vector<LoopOutcome>& loops, int64_t* resets) {
    for (int r = 0; r < trainers(); ++r) {
      ASSERT_TRUE(loops[r].finished)
          << "trainer " << r << ": "
          << loops[r].attempts.back().result.status();
      for (const StepOutcome& o : loops[r].attempts) {
        if (o.result.ok()) *resets += o.result->momentum_reset;
      }
    }
  }
  // Kills worker 1 and starts it again (its momentum is gone with it).
  void KillAndRestartWorker1() {
    ASSERT_NO_FATAL_FAILURE(KillWorker(1));
    ASSERT_NO_FATAL_FAILURE(RestartWorker(1));
    const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
    ASSERT_TRUE(planned.ok()) << planned;
  }

  const ModelDecl model_ = MixedModel();
  std::string checkpoint_dir_;  // empty: the job keeps no checkpoints
  std::optional<ReferenceModel> reference_;
};

// 2 workers become 3: the joining (dedicated) worker takes over matrices,
// their momentum handed over by the old owners before the first step of
// the new plan; parameters, AdamW and momentum stay equal to a replay in
// which nothing joined, bit for bit.
TEST_F(MomentumHandoverProcessTest, AJoiningWorkerTakesOverTheMomentumExactly) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*allow_reset=*/false, 3));
  std::vector<std::pair<std::string, int64_t>> items;
  std::vector<int> before;
  for (const testing::MatrixDecl& m : model_.matrices) {
    for (int64_t e = 0; e < m.options.experts; ++e) {
      items.push_back({m.name, e});
      before.push_back(Owner(m.name, e));
    }
  }
  ASSERT_NO_FATAL_FAILURE(JoinDedicatedWorker());
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  int moved = 0, to_new = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const int now = Owner(items[i].first, items[i].second);
    moved += now != before[i];
    to_new += now == kWorkers;
  }
  std::cerr << moved << " of " << items.size() << " matrices moved, " << to_new
            << " to the new worker\n";
  ASSERT_GT(to_new, 0) << "the plan gave the joining worker nothing";
  const std::vector<LoopOutcome> loops = RunTrainerLoops(4, 6, 3);
  int64_t resets = 0;
  ASSERT_NO_FATAL_FAILURE(ExpectFinished(loops, &resets));
  EXPECT_EQ(resets, 0);
  for (int64_t step = 4; step <= 6; ++step) {
    ASSERT_TRUE(reference_->Step(step).ok());
  }
  ExpectMatchesReference(*reference_, kExact);
}

// Strict (the default): the killed worker's matrices have no previous
// owner and no checkpoint; the next step fails on every trainer with
// FAILED_PRECONDITION naming a matrix, and nothing is applied.
TEST_F(MomentumHandoverProcessTest, AKilledOwnersMomentumFailsTheStepStrictly) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*allow_reset=*/false, 2));
  const auto lost = OwnedBy(1);
  ASSERT_FALSE(lost.empty());
  ASSERT_NO_FATAL_FAILURE(KillAndRestartWorker1());
  const std::vector<LoopOutcome> loops = RunTrainerLoops(3, 3, 3);
  for (int r = 0; r < trainers(); ++r) {
    EXPECT_FALSE(loops[r].finished) << "trainer " << r;
    const absl::Status& last = loops[r].attempts.back().result.status();
    EXPECT_EQ(last.code(), absl::StatusCode::kFailedPrecondition)
        << "trainer " << r << ": " << last;
    bool named = false;
    for (const auto& [name, expert] : lost) {
      named |=
          absl::StrContains(last.message(), absl::StrCat("\"", name, "\""));
    }
    EXPECT_TRUE(named) << last;
    EXPECT_TRUE(absl::StrContains(last.message(), "allow_momentum_reset"))
        << last;
  }
}

// With allow_momentum_reset the new owners start the killed worker's
// matrices from zero, the step results say how many, and training goes on
// equal to a replay that resets exactly those.
TEST_F(MomentumHandoverProcessTest, AllowedResetTrainsOnFromZeroMomentum) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*allow_reset=*/true, 2));
  const auto lost = OwnedBy(1);
  ASSERT_FALSE(lost.empty());
  ASSERT_NO_FATAL_FAILURE(KillAndRestartWorker1());
  const std::vector<LoopOutcome> loops = RunTrainerLoops(3, 4, 3);
  int64_t resets = 0;
  ASSERT_NO_FATAL_FAILURE(ExpectFinished(loops, &resets));
  EXPECT_EQ(resets, static_cast<int64_t>(lost.size()));
  ReferenceModel replay(model_, kWorkers, PlannedAlgorithms());
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(replay.Step(step).ok());
  }
  for (const auto& [name, expert] : lost) replay.ResetMomentum(name, expert);
  for (int64_t step = 3; step <= 4; ++step) {
    ASSERT_TRUE(replay.Step(step).ok());
  }
  ExpectMatchesReference(replay, kExact);
}

// A worker paused (SIGSTOP) past its lease between steps: the plan drops
// it, and its matrices have no momentum there (strict, no checkpoint).
// When it runs again it joins the next plan still holding their momentum
// as of the job's step (no step committed without it): that momentum
// comes back from it, and training goes on equal to a replay in which
// nothing paused. Before, the dropped version's lost items outranked it
// and no step ran again.
TEST_F(MomentumHandoverProcessTest,
       AWorkerPausedPastItsLeaseBringsItsMomentum) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*allow_reset=*/false, 2));
  ASSERT_FALSE(OwnedBy(1).empty());
  const int64_t version = plan().version();
  SignalWorker(1, SIGSTOP);
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  int64_t dropped_in = -1;
  while (absl::Now() < deadline && dropped_in < 0) {
    absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(0);
    if (status.ok() && status->plan_version() > version) {
      dropped_in = status->plan_version();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  // The other trainer steps meanwhile: its worker runs the new plan's
  // handover, where the paused worker's matrices are lost; no step can
  // commit without them.
  testing::StepScript alone;
  alone.silent = {1};
  const auto meanwhile = RunStep(3, alone);
  SignalWorker(1, SIGCONT);
  ASSERT_GT(dropped_in, version) << "the lease never expired";
  ASSERT_TRUE(meanwhile[0].has_value());
  EXPECT_FALSE(meanwhile[0]->result.ok());
  std::cerr << "step 3 without the paused worker: "
            << meanwhile[0]->result.status() << "\n";
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  const std::vector<LoopOutcome> loops = RunTrainerLoops(3, 4, 4);
  int64_t resets = 0;
  ASSERT_NO_FATAL_FAILURE(ExpectFinished(loops, &resets));
  EXPECT_EQ(resets, 0);
  for (int64_t step = 3; step <= 4; ++step) {
    ASSERT_TRUE(reference_->Step(step).ok());
  }
  ExpectMatchesReference(*reference_, kExact);
}

// With a checkpoint every step, the killed worker's momentum comes back
// from the checkpoint of the job's step and training goes on equal to a
// replay in which nothing was killed. Each item is read once: the restore
// on the new plan installs it, and the handover's lost items take that
// instead of reading (and counting) the checkpoint again.
TEST_F(MomentumHandoverProcessTest, AKilledOwnersMomentumIsRestoredOnce) {
  checkpoint_dir_ = testing::NewTempDir("handover-checkpoints");
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*allow_reset=*/false, 2));
  ASSERT_FALSE(OwnedBy(1).empty());
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(w, 2, /*restored=*/false));
  }
  ASSERT_NO_FATAL_FAILURE(KillAndRestartWorker1());
  const std::vector<LoopOutcome> loops = RunTrainerLoops(3, 4, 3);
  int64_t resets = 0;
  ASSERT_NO_FATAL_FAILURE(ExpectFinished(loops, &resets));
  EXPECT_EQ(resets, 0);
  for (int64_t step = 3; step <= 4; ++step) {
    ASSERT_TRUE(reference_->Step(step).ok());
  }
  ExpectMatchesReference(*reference_, kExact);
  EXPECT_TRUE(absl::StrContains(WorkerLog(1), "restored the momentum of"))
      << WorkerLog(1);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_FALSE(absl::StrContains(WorkerLog(w), "(its owner left)"))
        << "worker " << w << " read the checkpoint twice:\n"
        << WorkerLog(w);
  }
}

}  // namespace
}  // namespace muonps
