// Owners writing updates into the peers' staging (staging_windows.h): three
// StepEngines in one process whose trainers keep every parameter whole, so
// every trainer lends its staging in POSIX shared memory. Every layout's
// updates are written there, counted to the byte, and the parameters equal
// the same kernels in one process bit for bit, as they do when the updates
// are broadcast instead; so does an owner with no trainer, and 16-bit
// updates.
#include <cstdint>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "server/worker/step_engine_fixture.h"

namespace muonps {
namespace worker {
namespace {

constexpr int64_t kSteps = 4;

class PeerWritesTest : public StepEngineTest {
 protected:
  bool WholeParams() const override { return true; }

  // Matrix m's update bytes, `width` bytes an element.
  static double UpdateBytes(int m, int width) {
    const MatrixDecl& d = Matrices()[m];
    return static_cast<double>(d.rows * d.cols * width);
  }

  // Steps every engine kSteps times on owners `owners` (of `workers`, the
  // last `dedicated` without a trainer), against the kernels in one process.
  void StepOn(const std::vector<int>& owners, int workers, int dedicated) {
    plan_ = PlanWithOwnerList(1, owners, workers, dedicated);
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(plan_));
    ASSERT_NO_FATAL_FAILURE(AttachEverywhere(0, /*with_bias=*/true));
    if (dedicated > 0) StartFollowing();
    StepAndMatchTheKernelsInOneProcess(kSteps);
  }

  v1::Plan plan_;  // StepOn's

  // Steps every engine kSteps times on `owners`, against the kernels in
  // one process, expecting each worker to apply every update before its
  // commit: those it owns, those broadcast to it, and a peer's copies into
  // its staging once the peer's landing word says they landed
  // (staging_windows.h).
  void ExpectAppliedBeforeTheVotes(const std::vector<int>& owners) {
    plan_ = PlanWithOwnerList(1, owners);
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(plan_));
    ASSERT_NO_FATAL_FAILURE(AttachEverywhere(0, /*with_bias=*/true));
    ReferenceSteps reference({}, UpdateDtype());
    for (int64_t step = 0; step < kSteps; ++step) {
      WriteGradients(step);
      const std::vector<absl::StatusOr<StepResponse>> out =
          StepEverywhere(step);
      for (int w = 0; w < kWorkers; ++w) {
        ASSERT_TRUE(out[w].ok()) << out[w].status();
        int64_t expected = 0;
        for (size_t m = 0; m < owners.size(); ++m) {
          expected += Matrices()[m].rows * Matrices()[m].cols;
        }
        EXPECT_EQ(out[w]->applied_early, expected)
            << "worker " << w << " step " << step;
      }
      reference.Step(step);
    }
    ExpectParamsMatch(reference);
  }

  // Steps every engine kSteps times on `plan`, against the kernels in one
  // process, expecting every update at the commit: the worker's
  // --apply_early=never, or a plan whose clock found the commit faster
  // (Plan.apply_at_commit).
  void ExpectNothingAppliedBeforeTheVotes(const v1::Plan& plan) {
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(plan));
    ASSERT_NO_FATAL_FAILURE(AttachEverywhere(0, /*with_bias=*/true));
    ReferenceSteps reference({}, UpdateDtype());
    for (int64_t step = 0; step < kSteps; ++step) {
      WriteGradients(step);
      for (const absl::StatusOr<StepResponse>& r : StepEverywhere(step)) {
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->applied_early, 0);
      }
      reference.Step(step);
    }
    ExpectParamsMatch(reference);
  }

  // What worker w wrote and received by peer writes after kSteps steps:
  // each owned update once to every other trainer, each other update once,
  // but for each owner's last stack's, which go by broadcast
  // (UpdatesByBroadcast).
  void ExpectEveryUpdateWritten(const std::vector<int>& owners, int w,
                                int width) {
    const std::set<int> broadcast = UpdatesByBroadcast(plan_);
    double written = 0, received = 0;
    for (size_t m = 0; m < owners.size(); ++m) {
      if (broadcast.count(static_cast<int>(m)) > 0) continue;
      if (owners[m] == w) {
        written += UpdateBytes(static_cast<int>(m), width) *
                   (w < kWorkers ? kWorkers - 1 : kWorkers);
      } else if (w < kWorkers) {
        received += UpdateBytes(static_cast<int>(m), width);
      }
    }
    EXPECT_EQ(PeerWriteBytes(w), written * kSteps) << "worker " << w;
    EXPECT_EQ(PeerReceivedBytes(w), received * kSteps) << "worker " << w;
  }
};

TEST_F(PeerWritesTest, EveryUpdateIsWrittenIntoThePeersStagingBitForBit) {
  const std::vector<int> owners = {0, 1, 2, 0, 1};
  ASSERT_NO_FATAL_FAILURE(StepOn(owners, kWorkers, 0));
  for (int w = 0; w < kWorkers; ++w) ExpectEveryUpdateWritten(owners, w, 4);
}

TEST_F(PeerWritesTest, PeersCopiesApplyBeforeTheVotesOnceTheyLanded) {
  ExpectAppliedBeforeTheVotes({0, 1, 2, 0, 1});
}

class BroadcastUpdatesTest : public PeerWritesTest {
 protected:
  bool PeerWrites() const override { return false; }
};

TEST_F(BroadcastUpdatesTest, BroadcastUpdatesAllApplyBeforeTheVotes) {
  ExpectAppliedBeforeTheVotes({0, 1, 2, 0, 1});
}

// --apply_early=never: every update at the commit, bit for bit the same.
class UpdatesAtTheCommitTest : public BroadcastUpdatesTest {
 protected:
  bool ApplyEarly() const override { return false; }
};

TEST_F(UpdatesAtTheCommitTest, NothingAppliesBeforeTheVotesWhenTurnedOff) {
  ExpectNothingAppliedBeforeTheVotes(PlanWithOwnerList(1, {0, 1, 2, 0, 1}));
}

TEST_F(PeerWritesTest, NothingAppliesBeforeTheVotesWhereThePlanSaysSo) {
  v1::Plan plan = PlanWithOwnerList(1, {0, 1, 2, 0, 1});
  plan.set_apply_at_commit(true);
  ExpectNothingAppliedBeforeTheVotes(plan);
}

TEST_F(BroadcastUpdatesTest, WithoutWindowsTheUpdatesAreBroadcastBitForBit) {
  ASSERT_NO_FATAL_FAILURE(StepOn({0, 1, 2, 0, 1}, kWorkers, 0));
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(PeerWriteBytes(w), 0) << "worker " << w;
    EXPECT_EQ(PeerReceivedBytes(w), 0) << "worker " << w;
  }
}

class PeerWritesBf16Test : public PeerWritesTest {
 protected:
  DType UpdateDtype() const override { return DType::kBFloat16; }
};

TEST_F(PeerWritesBf16Test, SixteenBitUpdatesAreWrittenInSixteenBits) {
  const std::vector<int> owners = {2, 0, 1, 1, 0};
  ASSERT_NO_FATAL_FAILURE(StepOn(owners, kWorkers, 0));
  for (int w = 0; w < kWorkers; ++w) ExpectEveryUpdateWritten(owners, w, 2);
}

class PeerWritesDedicatedTest : public PeerWritesBf16Test {
 protected:
  int Dedicated() const override { return 1; }
};

TEST_F(PeerWritesDedicatedTest, AnOwnerWithNoTrainerWritesIntoEveryTrainer) {
  const std::vector<int> owners = {3, 0, 3, 1, 3};
  ASSERT_NO_FATAL_FAILURE(StepOn(owners, kWorkers + 1, 1));
  for (int w = 0; w <= kWorkers; ++w) ExpectEveryUpdateWritten(owners, w, 2);
}

// A trainer that keeps only its rows of a row-sharded parameter lends no
// window, so nobody writes and every update travels by the transport.
class PeerWritesShardedParamsTest : public StepEngineTest {};

TEST_F(PeerWritesShardedParamsTest, ShardedParametersKeepTheTransport) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  StepAndMatchTheKernelsInOneProcess(kSteps);
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(PeerWriteBytes(w), 0) << "worker " << w;
  }
}

}  // namespace
}  // namespace worker
}  // namespace muonps
