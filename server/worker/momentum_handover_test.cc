// The momentum handover (momentum_handover.h) among StepEngines in one
// process: moved matrices keep their momentum bit for bit, a joining worker
// receives what it now owns, and a matrix whose owner left fails the step
// naming it unless the job allows a reset.
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/worker/step_engine_fixture.h"

namespace muonps {
namespace worker {
namespace {

class MomentumHandoverTest : public StepEngineTest {
 protected:
  // Steps [first, last] everywhere, each once, the reference along; adds
  // up the responses' momentum_reset.
  void Steps(ReferenceSteps* reference, int64_t first, int64_t last,
             int64_t* resets) {
    for (int64_t step = first; step <= last; ++step) {
      WriteGradients(step);
      for (const auto& r : StepEverywhere(step)) {
        ASSERT_TRUE(r.ok()) << "step " << step << ": " << r.status();
        *resets += r->momentum_reset;
      }
      reference->Step(step);
    }
  }

  // Plan versions that move every matrix to another owner and back, two
  // of them with no step between: training goes on bit for bit, with no
  // momentum reset.
  void MoveEveryMatrixAndBack() {
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
    ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
    ReferenceSteps reference;
    int64_t resets = 0;
    ASSERT_NO_FATAL_FAILURE(Steps(&reference, 0, 2, &resets));
    // A shift of 1 moves every matrix to another owner: rep.a to w1.
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(2, 1)));
    ASSERT_NO_FATAL_FAILURE(Steps(&reference, 3, 3, &resets));
    // And again, so a matrix comes back to an owner that handed it over.
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(3, 2)));
    ASSERT_NO_FATAL_FAILURE(Steps(&reference, 4, 5, &resets));
    // Two versions with no step between them: the second one's handover
    // starts from what the workers held before the first.
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(4, 0)));
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(5, 2)));
    ASSERT_NO_FATAL_FAILURE(Steps(&reference, 6, 6, &resets));
    EXPECT_EQ(resets, 0);
    EXPECT_EQ(engines_[0]->Momentum("rep.a", 0).status().code(),
              absl::StatusCode::kNotFound);  // w2 owns it now
    EXPECT_TRUE(engines_[2]->Momentum("rep.a", 0).ok());
    for (const auto& engine : engines_) {
      EXPECT_EQ(engine->momentum_resets_total(), 0);
    }
    ExpectParamsMatch(reference);
  }
};

TEST_F(MomentumHandoverTest, MovedMomentumFollowsItsOwnerBitForBit) {
  MoveEveryMatrixAndBack();
}

// The same over control messages passed along a chain (a control tree of
// fanout 1: 0 - 1 - 2): every rank's announcement is broadcast from it
// through its neighbors, hop by hop.
using MomentumHandoverControlChainTest = ControlChain<MomentumHandoverTest>;

TEST_F(MomentumHandoverControlChainTest,
       MovedMomentumFollowsItsOwnerBitForBit) {
  MoveEveryMatrixAndBack();
}

// Three workers with trainers and a dedicated fourth.
class MomentumHandoverDedicatedTest : public MomentumHandoverTest {
 protected:
  int Dedicated() const override { return 1; }
  void SetPlanOn(const v1::Plan& plan, bool allow_reset, int engines) {
    v1::JobSpec job = Job(Dedicated());
    job.set_allow_momentum_reset(allow_reset);
    for (int w = 0; w < engines; ++w) {
      ASSERT_TRUE(SetPlanFromProto(*engines_[w], job, plan, addresses_).ok());
    }
  }
  // w3 stops stepping (a killed dedicated worker).
  void StopFollowing() {
    following_.store(false);
    for (std::thread& t : followers_) t.join();
    followers_.clear();
  }
  // Steps 0..2 with rep.a, unr.a and row.a owned by the dedicated w3.
  void TrainWithTheDedicatedWorker(ReferenceSteps* reference, bool allow) {
    ASSERT_NO_FATAL_FAILURE(SetPlanOn(
        PlanWithOwnerList(1, {3, 0, 3, 1, 3}, kWorkers + 1, 1), allow, 4));
    ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
    StartFollowing();
    int64_t resets = 0;
    ASSERT_NO_FATAL_FAILURE(Steps(reference, 0, 2, &resets));
    EXPECT_EQ(resets, 0);
  }
};

// A worker joins: the plan grows from three workers to four and some
// matrices move to the newcomer, some among the others; training goes on
// bit for bit as if nothing had moved.
TEST_F(MomentumHandoverDedicatedTest, AJoiningWorkerReceivesWhatItNowOwns) {
  // Version 1: three workers (the job expects no dedicated one yet).
  v1::JobSpec three = Job(0);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(SetPlanFromProto(*engines_[w], three,
                                 PlanWithOwnerList(1, {0, 1, 2, 0, 1}),
                                 addresses_)
                    .ok());
  }
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  ReferenceSteps reference;
  int64_t resets = 0;
  ASSERT_NO_FATAL_FAILURE(Steps(&reference, 0, 2, &resets));
  // Version 2: w3 joins and takes rep.a and unr.a; row.a moves w1 -> w2.
  ASSERT_NO_FATAL_FAILURE(SetPlanOn(
      PlanWithOwnerList(2, {3, 1, 3, 0, 2}, kWorkers + 1, 1), false, 4));
  StartFollowing();
  ASSERT_NO_FATAL_FAILURE(Steps(&reference, 3, 5, &resets));
  EXPECT_EQ(resets, 0);
  ExpectParamsMatch(reference);
  EXPECT_TRUE(engines_[3]->Momentum("rep.a", 0).ok());
  EXPECT_EQ(engines_[3]->momentum_resets_total(), 0);
}

// The dedicated worker dies: its matrices have no previous owner and no
// checkpoint. Strict (the default): every worker's step fails naming one.
TEST_F(MomentumHandoverDedicatedTest, LostMomentumFailsTheStepNamingTheMatrix) {
  ReferenceSteps reference;
  ASSERT_NO_FATAL_FAILURE(TrainWithTheDedicatedWorker(&reference, false));
  StopFollowing();
  ASSERT_NO_FATAL_FAILURE(
      SetPlanOn(PlanWithOwnerList(2, {0, 1, 2, 0, 1}), false, kWorkers));
  WriteGradients(3);
  for (int attempt = 0; attempt < 2; ++attempt) {  // and stays so
    for (const auto& r : StepEverywhere(3)) {
      ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition)
          << r.status();
      EXPECT_NE(r.status().message().find("matrix \"rep.a\""),
                std::string::npos)
          << r.status();
      EXPECT_NE(r.status().message().find("3 matrices"), std::string::npos)
          << r.status();
      EXPECT_NE(r.status().message().find("allow_momentum_reset"),
                std::string::npos)
          << r.status();
    }
  }
  for (int w = 0; w < kWorkers; ++w) EXPECT_EQ(engines_[w]->last_step(), 2);
}

// The same with allow_momentum_reset: the new owners start those from zero,
// say how many, and training goes on.
TEST_F(MomentumHandoverDedicatedTest, AllowedResetStartsLostMomentumAtZero) {
  ReferenceSteps reference;
  ASSERT_NO_FATAL_FAILURE(TrainWithTheDedicatedWorker(&reference, true));
  StopFollowing();
  ASSERT_NO_FATAL_FAILURE(
      SetPlanOn(PlanWithOwnerList(2, {0, 1, 2, 0, 1}), true, kWorkers));
  WriteGradients(3);
  int64_t resets = 0;
  for (const auto& r : StepEverywhere(3)) {
    ASSERT_TRUE(r.ok()) << r.status();
    resets += r->momentum_reset;
  }
  EXPECT_EQ(resets, 3);  // rep.a on w0, unr.a on w2, row.a on w1
  int64_t total = 0;
  for (int w = 0; w < kWorkers; ++w) {
    total += engines_[w]->momentum_resets_total();
  }
  EXPECT_EQ(total, 3);
  // rep.b moved from w0 (alive) to w1: handed over, not reset.
  EXPECT_TRUE(engines_[1]->Momentum("rep.b", 0).ok());
  WriteGradients(4);
  for (const auto& r : StepEverywhere(4)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->momentum_reset, 0);
  }
}

}  // namespace
}  // namespace worker
}  // namespace muonps
