// Three StepEngines in one process, each with its "trainer" in host memory,
// over loopback TCP transports: the worker's data path without processes
// or a coordinator. Proves the renovated step path: every layout reaches
// the single-process result of the same kernels (bit for bit: the mean is
// summed in trainer order), a non-finite gradient on one trainer rejects
// the step on all three with nothing changed, a retried step id is a
// no-op, and a new plan version keeps the momentum of items whose owner
// did not change (and counts the ones that start over).
#include "server/worker/step_engine.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "server/worker/step_engine_fixture.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

TEST_F(StepEngineTest, EveryLayoutMatchesTheKernelsInOneProcessBitForBit) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  StepAndMatchTheKernelsInOneProcess(5);
}

// The stack [rep.b, rep.a] (arrival order) as one Newton-Schulz call.
TEST_F(StepEngineTest, UnsplitBatchMatchesTheKernelsInOneProcessBitForBit) {
  ASSERT_NO_FATAL_FAILURE(
      SetPlanEverywhere(PairOnW0({{2, v1::NS_ALGORITHM_NS5}})));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  StepAndMatchTheKernelsInOneProcess(6);
}

// The same stack as two calls of one matrix: the very parameters of the
// unsplit batch above (both equal the same reference, bit for bit), since
// Newton-Schulz is per matrix.
TEST_F(StepEngineTest, SplitBatchGivesTheUnsplitParametersBitForBit) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(
      PairOnW0({{1, v1::NS_ALGORITHM_NS5}, {1, v1::NS_ALGORITHM_NS5}})));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  StepAndMatchTheKernelsInOneProcess(6);
}

// Parts of different algorithms: the first part (Gram) takes the stack's
// first item, rep.b; rep.a runs NS5.
TEST_F(StepEngineTest, EachPartRunsItsOwnAlgorithm) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(
      PairOnW0({{1, v1::NS_ALGORITHM_GRAM}, {1, v1::NS_ALGORITHM_NS5}})));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  ReferenceSteps mixed({{"rep.b", NsAlgorithm::kGram}});
  ReferenceSteps ns5;
  for (int64_t step = 0; step < 6; ++step) {
    WriteGradients(step);
    for (const absl::StatusOr<StepResponse>& r : StepEverywhere(step)) {
      ASSERT_TRUE(r.ok()) << r.status();
    }
    mixed.Step(step);
    ns5.Step(step);
  }
  ExpectParamsMatch(mixed);
  // Gram and NS5 round differently: the test tells them apart.
  EXPECT_NE(mixed.param("rep.b"), ns5.param("rep.b"));
  EXPECT_EQ(mixed.param("rep.a"), ns5.param("rep.a"));
}

// bf16 trainers: the workers widen the gradients, keep fp32 momentum, and
// round each updated parameter once; the same as the kernels in one
// process on the widened gradients, followed by that one rounding.
TEST_F(StepEngineTest, Bf16ParametersMatchTheKernelsInOneProcessBitForBit) {
  UseBf16Everywhere();
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  kernels::CpuKernels reference_kernels(kernels::CpuKernelOptions{});
  kernels::CpuDeviceOps ops;
  std::map<std::string, std::vector<uint16_t>> param;
  std::map<std::string, std::vector<float>> momentum;
  for (const MatrixDecl& d : Matrices()) {
    param[d.name].assign(d.rows * d.cols, FloatToBFloat16(0.5f));
    momentum[d.name].assign(d.rows * d.cols, 0.0f);
  }
  const kernels::MuonHyperparameters h = MuonFromJob();
  for (int64_t step = 0; step < 12; ++step) {
    WriteGradients(step);
    for (const absl::StatusOr<StepResponse>& r : StepEverywhere(step)) {
      ASSERT_TRUE(r.ok()) << r.status();
    }
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixDecl& d = Matrices()[m];
      std::vector<float> g = WholeGradient(step, static_cast<int>(m), true);
      const kernels::MatrixStack grad{g.data(), 1, d.rows, d.cols};
      ASSERT_TRUE(reference_kernels
                      .UpdateMomentum(
                          grad, {momentum[d.name].data(), 1, d.rows, d.cols},
                          {momentum[d.name].data(), 1, d.rows, d.cols},
                          h.momentum, h.nesterov, grad, kHostStream)
                      .ok());
      ASSERT_TRUE(
          reference_kernels.Orthogonalize(grad, grad, h.ns, kHostStream).ok());
      const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
      const float scale = static_cast<float>(
          -kernels::AdjustedLr(h.lr, h.lr_adjustment, d.rows, d.cols));
      ASSERT_TRUE(ops.ApplyScaled(param[d.name].data(), DType::kBFloat16,
                                  g.data(), DType::kFloat32, d.rows * d.cols,
                                  decay, scale, kHostStream)
                      .ok());
    }
  }
  for (int w = 0; w < kWorkers; ++w) {
    for (const MatrixDecl& d : Matrices()) {
      const std::vector<uint16_t>& got = trainers_[w].param16[d.name];
      const int64_t first = d.layout == v1::LAYOUT_ROW_SHARDED
                                ? d.rows * w / kWorkers * d.cols
                                : 0;
      EXPECT_EQ(
          std::memcmp(got.data(), param[d.name].data() + first, got.size() * 2),
          0)
          << d.name << " on trainer " << w;
      EXPECT_NE(got[0], FloatToBFloat16(0.5f)) << d.name << " never moved";
    }
  }
}

TEST_F(StepEngineTest, NonFiniteGradientOnOneTrainerRejectsTheStepEverywhere) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  trainers_[2].grad["unr.b"][7] = NAN;
  const std::vector<absl::StatusOr<StepResponse>> out = StepEverywhere(0);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_FALSE(out[w].ok());
    EXPECT_EQ(out[w].status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(out[w].status().message().find("\"unr.b\": element 7 is NaN"),
              std::string::npos)
        << out[w].status();
    for (const MatrixDecl& d : Matrices()) {
      for (float v : trainers_[w].param[d.name]) ASSERT_EQ(v, 0.5f) << d.name;
    }
  }
  // The transports survive a rejection: the same step id, now finite.
  WriteGradients(0);
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
  // And a retried id is a no-op.
  const std::vector<float> before = trainers_[0].param["rep.a"];
  for (const auto& r : StepEverywhere(0)) {
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->already_applied);
  }
  EXPECT_EQ(trainers_[0].param["rep.a"], before);
}

// A worker whose next stack needs nothing from its peers (w0 owns both
// replicated matrices, one stack) computes it while the ranks agree
// (StepStaging::ComputeAhead); the others' first stacks wait for gradients
// of the peers. A round that then runs no step (a NaN on another trainer
// rejects it) drops what w0 computed, and the steps after it, the retry
// first, still equal the kernels in one process bit for bit.
TEST_F(StepEngineTest, AStackComputedAheadOfARejectedRoundIsDropped) {
  ASSERT_NO_FATAL_FAILURE(
      SetPlanEverywhere(PlanWithOwnerList(1, {0, 0, 1, 1, 2})));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  ReferenceSteps reference;
  for (int64_t step = 0; step < 6; ++step) {
    WriteGradients(step);
    if (step == 3) {
      trainers_[2].grad["unr.b"][7] = NAN;
      for (const auto& r : StepEverywhere(step)) {
        ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
            << r.status();
      }
      WriteGradients(step);
    }
    const std::vector<absl::StatusOr<StepResponse>> out = StepEverywhere(step);
    for (int w = 0; w < kWorkers; ++w) {
      ASSERT_TRUE(out[w].ok()) << out[w].status();
      // From the second step: ahead only under the plan version that
      // committed the step before.
      EXPECT_EQ(out[w]->computed_ahead, w == 0 && step > 0)
          << "worker " << w << " step " << step;
    }
    reference.Step(step);
  }
  ExpectParamsMatch(reference);
}

// The engine hands the factory the secret it was last given: with none yet
// (the worker is joining) a step is refused as a transient state, naming
// the field; once the job's secret arrives the next step connects and runs.
TEST_F(StepEngineTest, StepsNeedTheDataPlaneSecretGivenToTheEngine) {
  for (auto& engine : engines_) engine->SetDataPlaneSecret("");
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  for (const auto& r : StepEverywhere(0)) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find("data_plane_secret"), std::string::npos)
        << r.status();
    EXPECT_NE(r.status().message().find("retry"), std::string::npos)
        << r.status();
  }
  for (auto& engine : engines_) {
    engine->SetDataPlaneSecret(transport::kLoopbackSecret);
  }
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
}

// Hyperparameters are checked and agreed like gradients: a NaN group lr on
// one trainer, or trainers whose lr differ, refuse the step on every worker
// with the reason, and nothing changes.
TEST_F(StepEngineTest, BadOrDisagreeingHyperparametersRefuseTheStepEverywhere) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  const std::vector<float> before = trainers_[1].param["rep.a"];
  const std::vector<
      std::pair<std::string, std::function<void(int, v1::StepRequest*)>>>
      cases = {
          {"groups[0].lr: nan",
           [](int w, v1::StepRequest* r) {
             v1::GroupHyperparameters* g = r->add_groups();
             g->set_lr(w == 2 ? NAN : 0.01);
             g->set_weight_decay(0.1);
           }},
          {"lr: inf",
           [](int w, v1::StepRequest* r) {
             if (w == 0) r->set_lr(INFINITY);
           }},
          {"step with different lr, weight_decay",
           [](int w, v1::StepRequest* r) { r->set_lr(w == 1 ? 0.03 : 0.02); }},
      };
  for (const auto& [reason, edit] : cases) {
    const std::vector<absl::StatusOr<StepResponse>> out =
        StepEverywhere(0, edit);
    for (int w = 0; w < kWorkers; ++w) {
      ASSERT_FALSE(out[w].ok()) << reason;
      EXPECT_EQ(out[w].status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(out[w].status().message().find(reason), std::string::npos)
          << out[w].status();
    }
    EXPECT_EQ(trainers_[1].param["rep.a"], before) << reason;
  }
  // The transports survive: the same step with good hyperparameters.
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
}

// Lent memory that is no longer whole (a truncated segment) is not read:
// the step is refused on every worker naming it, and the next one runs.
TEST_F(StepEngineTest, MemoryNoLongerIntactRefusesTheStepEverywhere) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  trainers_[1].intact = absl::FailedPreconditionError(
      "shared memory segment \"/muonps-x\": truncated to 0 of its 4096 bytes");
  for (const auto& r : StepEverywhere(0)) {
    ASSERT_FALSE(r.ok());
    // The memory's own code, on every rank.
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find("truncated to 0"), std::string::npos)
        << r.status();
  }
  for (const MatrixDecl& d : Matrices()) {
    for (float v : trainers_[0].param[d.name]) ASSERT_EQ(v, 0.5f) << d.name;
  }
  trainers_[1].intact = absl::OkStatus();
  for (const auto& r : StepEverywhere(0)) EXPECT_TRUE(r.ok()) << r.status();
}

// A shared-memory segment not named for the job, the trainer's rank and
// pid is refused before anything maps it, naming the field.
TEST_F(StepEngineTest, SegmentNotNamedForThisJobAndTrainerIsRefused) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  for (const char* name :
       {"/muonps-other-job-r0-77-1", "/muonps-engine-test-r1-77-1",
        "/muonps-engine-test-r0-78-1", "/muonps-engine-test-r0-77",
        "/anything"}) {
    v1::AttachRequest request;
    request.set_trainer_rank(0);
    request.set_trainer_count(kWorkers);
    request.set_trainer_pid(77);
    request.set_segment(name);
    request.set_segment_bytes(4096);
    const absl::StatusOr<AttachResponse> attached =
        AttachFromProto(*engines_[0], request);
    EXPECT_EQ(attached.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_NE(attached.status().message().find("segment"), std::string::npos)
        << attached.status();
  }
}

// Status and heartbeats read last_step() while a step waits on its peers:
// it must answer at once, not after the step (or its timeout).
TEST_F(StepEngineTest, LastStepNeverWaitsForAStepInProgress) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  v1::StepRequest request;
  request.set_step_id(0);
  request.set_lr(-1);
  request.set_weight_decay(-1);
  absl::StatusOr<StepResponse> first = absl::UnknownError("not run");
  std::thread waiting([&] { first = StepFromProto(*engines_[0], request); });
  absl::SleepFor(absl::Milliseconds(200));  // rank 0 now waits on the others
  const absl::Time asked = absl::Now();
  EXPECT_EQ(engines_[0]->last_step(), -1);
  EXPECT_LT(absl::Now() - asked, absl::Milliseconds(100));
  std::vector<std::thread> others;
  for (int w = 1; w < kWorkers; ++w) {
    others.emplace_back([&, w] { (void)StepFromProto(*engines_[w], request); });
  }
  for (std::thread& t : others) t.join();
  waiting.join();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(engines_[0]->last_step(), 0);
}

TEST_F(StepEngineTest, NewPlanKeepsMomentumOfUnmovedItemsAndHandsOverOthers) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  WriteGradients(0);
  for (const auto& r : StepEverywhere(0)) ASSERT_TRUE(r.ok()) << r.status();
  // A shift of 3 keeps every owner (3 workers); a shift of 1 moves all.
  absl::StatusOr<std::vector<float>> kept = engines_[0]->Momentum("rep.a", 0);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(2, 3)));
  absl::StatusOr<std::vector<float>> after = engines_[0]->Momentum("rep.a", 0);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(*kept, *after);
  // Now move everything: the old owners hand the momentum over before the
  // first step of the version (momentum_handover_test.cc checks the bits);
  // nothing starts over.
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(3, 1)));
  EXPECT_EQ(engines_[0]->Momentum("rep.a", 0).status().code(),
            absl::StatusCode::kNotFound);  // w1 owns it now
  EXPECT_EQ(engines_[1]->Momentum("rep.a", 0).status().code(),
            absl::StatusCode::kNotFound);  // not handed over yet
  WriteGradients(1);
  int64_t resets = 0;
  for (const auto& r : StepEverywhere(1)) {
    ASSERT_TRUE(r.ok()) << r.status();
    resets += r->momentum_reset;
  }
  EXPECT_EQ(resets, 0);
  EXPECT_TRUE(engines_[1]->Momentum("rep.a", 0).ok());
  for (const auto& engine : engines_) {
    EXPECT_EQ(engine->momentum_resets_total(), 0);
  }
}

TEST_F(StepEngineTest, BuffersOfATrainerWhoseProcessIsGoneAreReleased) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  // A live trainer (this process) keeps its buffers.
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere(getpid()));
  EXPECT_FALSE(engines_[0]->ReleaseTrainerIfGone());
  // A trainer process that exited (and was reaped) loses them.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere(child));
  EXPECT_TRUE(engines_[0]->ReleaseTrainerIfGone());
  EXPECT_FALSE(engines_[0]->ReleaseTrainerIfGone());  // once
  v1::StepRequest request;
  request.set_step_id(0);
  absl::StatusOr<StepResponse> step = StepFromProto(*engines_[0], request);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(step.status().message().find("no trainer buffers"),
            std::string::npos)
      << step.status();
}

// A fourth worker with no trainer (a GPU of a dedicated optimizer pool),
// ranked last: it owns a replicated matrix (trainer 0's worker sends it the
// gradient), an unreduced one (its part of the sum is zeros) and a
// row-sharded one (it gathers every trainer's rows and scatters the update
// back), steps whenever the others do, and the trainers' parameters stay
// bit-identical to the kernels in one process; the unreduced AdamW
// gradient is still the trainers' mean.
class StepEngineDedicatedTest : public StepEngineTest {
 protected:
  int Dedicated() const override { return 1; }

  // rep.a, unr.a and row.a on the dedicated w3, rep.b on w0, unr.b on w1:
  // six steps, the trainers' parameters against the kernels in one process,
  // and the dedicated engine's part of each.
  void StepWithTheDedicatedOwner() {
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(
        PlanWithOwnerList(1, {3, 0, 3, 1, 3}, kWorkers + 1, /*dedicated=*/1)));
    ASSERT_NO_FATAL_FAILURE(AttachEverywhere(0, /*with_bias=*/true));
    StartFollowing();
    StepAndMatchTheKernelsInOneProcess(6);
    // The dedicated engine returns from its part of the last step a moment
    // after the others may have.
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (followed_steps_.load() < 6 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(followed_steps_.load(), 6);
  }
};

TEST_F(StepEngineDedicatedTest, AWorkerWithNoTrainerOwnsMatricesOfEveryLayout) {
  ASSERT_NO_FATAL_FAILURE(StepWithTheDedicatedOwner());
  for (const char* owned : {"rep.a", "unr.a", "row.a"}) {
    EXPECT_TRUE(engines_[3]->Momentum(owned, 0).ok()) << owned;
  }
  // The last step's bias gradients: their mean, summed in trainer order.
  for (int i = 0; i < 7; ++i) {
    float sum = 0;
    for (int t = 0; t < kWorkers; ++t) sum += GradValue(5, 99, t, i);
    const float mean = sum * (1.0f / static_cast<float>(kWorkers));
    for (int w = 0; w < kWorkers; ++w) {
      EXPECT_EQ(trainers_[w].bias_grad[i], mean) << w << " " << i;
    }
  }
  // The dedicated worker takes no trainer.
  v1::AttachRequest request;
  request.set_trainer_rank(0);
  request.set_trainer_count(kWorkers);
  const absl::StatusOr<AttachResponse> refused =
      AttachFromProto(*engines_[3], request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("dedicated"), std::string::npos)
      << refused.status();
}

// The dedicated worker at the end of a chain of control messages (a
// control tree of fanout 1: 0 - 1 - 2 - 3): rank 2, which has a trainer,
// opens each round for it, and every gather and broadcast passes along
// three hops.
using StepEngineDedicatedControlChainTest =
    ControlChain<StepEngineDedicatedTest>;

TEST_F(StepEngineDedicatedControlChainTest,
       AWorkerWithNoTrainerFollowsTheRoundsItsParentOpens) {
  ASSERT_NO_FATAL_FAILURE(StepWithTheDedicatedOwner());
  for (const char* owned : {"rep.a", "unr.a", "row.a"}) {
    EXPECT_TRUE(engines_[3]->Momentum(owned, 0).ok()) << owned;
  }
}

// Updates rounded to bf16, as Newton-Schulz in bf16 on a GPU makes them:
// they move and wait in bf16 (broadcast, scattered rows, and an owner with
// no trainer rounding its own into its stack's 16-bit buffer), and every
// layout still equals the same kernels in one process, which round the
// same way, bit for bit.
class StepEngineBf16UpdatesTest : public StepEngineTest {
 protected:
  DType UpdateDtype() const override { return DType::kBFloat16; }
};

TEST_F(StepEngineBf16UpdatesTest, EveryLayoutMatchesTheKernelsInOneProcess) {
  ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(PlanWithOwners(1, 0)));
  ASSERT_NO_FATAL_FAILURE(AttachEverywhere());
  StepAndMatchTheKernelsInOneProcess(5);
}

class StepEngineDedicatedBf16UpdatesTest : public StepEngineDedicatedTest {
 protected:
  DType UpdateDtype() const override { return DType::kBFloat16; }
};

TEST_F(StepEngineDedicatedBf16UpdatesTest,
       AWorkerWithNoTrainerSendsItsUpdatesInBf16) {
  ASSERT_NO_FATAL_FAILURE(StepWithTheDedicatedOwner());
}

TEST(EarlyApplyPolicyTest, TheFlagsWordsAndOnlyThem) {
  EXPECT_EQ(*EarlyApplyPolicyFromName("plan"), EarlyApplyPolicy::kAsPlanned);
  EXPECT_EQ(*EarlyApplyPolicyFromName("always"), EarlyApplyPolicy::kAlways);
  EXPECT_EQ(*EarlyApplyPolicyFromName("never"), EarlyApplyPolicy::kNever);
  const absl::StatusOr<EarlyApplyPolicy> bad = EarlyApplyPolicyFromName("true");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "--apply_early"));
}

}  // namespace
}  // namespace worker
}  // namespace muonps
