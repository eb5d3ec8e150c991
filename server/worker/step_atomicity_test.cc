// Atomic, idempotent steps, on three StepEngines in one process
// over loopback TCP whose transports fail or stall at a chosen call: a
// failure at any call of a step, on any rank, followed by the trainers'
// retries, leaves every parameter bit for bit where a failure-free run
// puts it (nothing applied twice, nothing half-applied); a call cancelled
// before the vote aborts the step everywhere; a step in doubt survives a new
// plan version; a plan that drops a frozen peer aborts the step at once;
// status and heartbeat calls never wait for a step.
#include <cmath>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lending/step_record.h"
#include "server/worker/step_engine_fixture.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

// Several buckets per step, so that transfers of later buckets follow the
// updates of earlier ones (applied at once before this change).
constexpr int64_t kSmallBuckets = 4096;

class StepAtomicityTest : public StepEngineTest {
 protected:
  // A lost peer shows up as a closed connection at once; a stalled one
  // after this.
  absl::Duration IoTimeout() const override { return absl::Seconds(1); }

  // The job's plan, and the trainers by node of its exchange nodes
  // (none: the rings).
  virtual v1::Plan JobPlan() const { return PlanWithOwners(1, 0); }
  virtual std::vector<std::vector<int>> ExchangeNodes() const { return {}; }

  void SetUpJob() {
    ASSERT_NO_FATAL_FAILURE(SetPlanEverywhere(JobPlan(), kSmallBuckets));
    ASSERT_NO_FATAL_FAILURE(AttachEverywhere(0, /*with_bias=*/true));
  }

  // Worker `w`'s call gives up once it was asked whether it had; the
  // others' never do.
  static std::function<StepCancelled(int)> CancelledAfterOneAsk(int w) {
    return [w](int worker) -> StepCancelled {
      if (worker != w) return StepCancelled();
      auto asked = std::make_shared<int>(0);
      return [asked] { return ++*asked > 1; };
    };
  }

  // Transport calls worker w makes in step `step` (run clean).
  int64_t ProbeCalls(int w, int64_t step) {
    SetFault(w, {.step = step, .call = int64_t{1} << 40});
    const std::vector<int> failures = RunTrainerLoops(step, step);
    const int64_t calls = CallsCounted(w);
    SetFault(w, {});
    EXPECT_EQ(failures, std::vector<int>(kWorkers, 0));
    return calls;
  }

  // The last step's AdamW gradient on every trainer: the trainers' mean,
  // summed in trainer order, once.
  void ExpectBiasGradientIsTheMeanOf(int64_t step) {
    for (int i = 0; i < 7; ++i) {
      float sum = 0;
      for (int t = 0; t < kWorkers; ++t) sum += GradValue(step, 99, t, i);
      const float mean = sum * (1.0f / static_cast<float>(kWorkers));
      for (int w = 0; w < kWorkers; ++w) {
        EXPECT_EQ(trainers_[w].bias_grad[i], mean) << w << " " << i;
      }
    }
  }

  // Each worker's transport calls in a clean step of its own (steps
  // *step, *step + 1, ...), which `reference` steps too; `before` runs
  // before each one when set.
  std::vector<int64_t> ProbeEachWorker(
      int64_t* step, ReferenceSteps* reference,
      const std::function<void()>& before = nullptr) {
    std::vector<int64_t> calls;
    for (int w = 0; w < kWorkers; ++w) {
      if (before) before();
      calls.push_back(ProbeCalls(w, *step));
      reference->Step((*step)++);
    }
    return calls;
  }

  // Every call of a step on ranks 0, 1 and 2 fails once in turn (the
  // transport aborts there, as a cut connection or a killed peer's would):
  // the trainers retry until the step is answered and go on; at the end the
  // parameters are the failure-free run's, bit for bit.
  void SweepEveryTransportCall() {
    ASSERT_NO_FATAL_FAILURE(SetUpJob());
    ReferenceSteps reference({}, DType::kFloat32, ExchangeNodes());
    int64_t step = 0;
    const std::vector<int64_t> calls = ProbeEachWorker(&step, &reference);
    for (int w = 0; w < kWorkers; ++w) {
      ASSERT_GT(calls[w], 10) << "worker " << w;
    }
    int fired = 0;
    for (int w = 0; w < kWorkers; ++w) {
      for (int64_t call = 0; call < calls[w]; ++call) {
        SetFault(w, {.step = step, .call = call});
        const std::vector<int> failures = RunTrainerLoops(step, step + 1);
        EXPECT_GT(failures[0] + failures[1] + failures[2], 0)
            << "the failure at call " << call << " of worker " << w
            << " went unnoticed";
        reference.Step(step);
        reference.Step(step + 1);
        step += 2;
        fired += CallsCounted(w) > call ? 1 : 0;
        SetFault(w, {});
        ASSERT_FALSE(HasFailure())
            << "failure at call " << call << " of worker " << w;
      }
    }
    EXPECT_EQ(fired, calls[0] + calls[1] + calls[2]);
    std::cerr << "failures injected at " << fired << " calls (per worker "
              << calls[0] << ", " << calls[1] << ", " << calls[2] << ")\n";
    ExpectParamsMatch(reference);
    ExpectBiasGradientIsTheMeanOf(step - 1);
  }
};

// Before staging, a failure after some buckets left them applied and the
// retry applied them again (or was refused: one rank already at the next
// step).
TEST_F(StepAtomicityTest,
       AFailureAtEveryTransportCallLeavesTheFailureFreeParameters) {
  SweepEveryTransportCall();
}

// The same with the unreduced gradients summed in two levels over three
// nodes of one worker each (node_exchange_transfers.h): one rail of three,
// and a failure at any of the exchange's calls leaves the failure-free
// parameters too.
class StepAtomicityNodeExchangeTest : public StepAtomicityTest {
 protected:
  v1::Plan JobPlan() const override {
    v1::Plan plan = PlanWithOwners(1, 0);
    for (int w = 0; w < kWorkers; ++w) {
      plan.add_exchange_nodes()->add_workers(absl::StrCat("w", w));
    }
    return plan;
  }
  std::vector<std::vector<int>> ExchangeNodes() const override {
    return {{0}, {1}, {2}};
  }
};

TEST_F(StepAtomicityNodeExchangeTest,
       AFailureAtEveryTransportCallLeavesTheFailureFreeParameters) {
  SweepEveryTransportCall();
}

// The same with every trainer keeping whole parameters: owners write the
// updates into the peers' staging (staging_windows.h), and a failure
// anywhere, a resolution that commits from staging included, still leaves
// the failure-free parameters.
class StepAtomicityPeerWritesTest : public StepAtomicityTest {
 protected:
  bool WholeParams() const override { return true; }

  // Whether worker w writes any update into its peers' staging: it owns
  // one that does not go by broadcast (UpdatesByBroadcast).
  bool WritesAny(int w) const {
    const v1::Plan plan = JobPlan();
    const std::set<int> broadcast = UpdatesByBroadcast(plan, kSmallBuckets);
    for (int m = 0; m < plan.matrices_size(); ++m) {
      if (plan.matrices(m).owners(0) == absl::StrCat("w", w) &&
          broadcast.count(m) == 0) {
        return true;
      }
    }
    return false;
  }
};

TEST_F(StepAtomicityPeerWritesTest,
       AFailureAtEveryTransportCallLeavesTheFailureFreeParameters) {
  SweepEveryTransportCall();
  int writers = 0;
  for (int w = 0; w < kWorkers; ++w) {
    if (!WritesAny(w)) continue;
    ++writers;
    EXPECT_GT(PeerWriteBytes(w), 0) << "worker " << w;
  }
  EXPECT_GE(writers, 2);
}

// The same where w0 owns both replicated matrices, whose stack it computes
// while the ranks agree (StepStaging::ComputeAhead): a failure at any call,
// the agreement's included, drops that stack with the rest of the staging.
class StepAtomicityComputeAheadTest : public StepAtomicityPeerWritesTest {
 protected:
  v1::Plan JobPlan() const override {
    return PlanWithOwnerList(1, {0, 0, 1, 1, 2});
  }
};

TEST_F(StepAtomicityComputeAheadTest,
       AFailureAtEveryTransportCallLeavesTheFailureFreeParameters) {
  SweepEveryTransportCall();
}

// A new attachment lends new windows, and the next step exchanges them
// first: a failure at any call of that step, the exchange's included, is
// retried into the failure-free parameters, and the windows are written
// into afterwards.
TEST_F(StepAtomicityPeerWritesTest,
       AFailureAtEveryCallOfAWindowExchangeLeavesTheFailureFreeParameters) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ReferenceSteps reference;
  int64_t step = 0;
  const std::vector<int64_t> calls = ProbeEachWorker(
      &step, &reference, [&] { AttachEverywhere(0, /*with_bias=*/true); });
  ASSERT_FALSE(HasFatalFailure());
  // The exchange's calls come first in the step after an attachment.
  const int64_t plain = ProbeCalls(0, step);
  reference.Step(step++);
  ASSERT_GT(calls[0], plain);
  for (int w = 0; w < kWorkers; ++w) {
    const bool writes = WritesAny(w);
    for (int64_t call = 0; call < calls[w]; ++call) {
      ASSERT_NO_FATAL_FAILURE(AttachEverywhere(0, /*with_bias=*/true));
      SetFault(w, {.step = step, .call = call});
      const double written = PeerWriteBytes(w);
      const std::vector<int> failures = RunTrainerLoops(step, step + 1);
      EXPECT_GT(failures[0] + failures[1] + failures[2], 0)
          << "the failure at call " << call << " of worker " << w
          << " went unnoticed";
      if (writes) {
        EXPECT_GT(PeerWriteBytes(w), written) << "worker " << w;
      }
      reference.Step(step);
      reference.Step(step + 1);
      step += 2;
      SetFault(w, {});
      ASSERT_FALSE(HasFailure())
          << "failure at call " << call << " of worker " << w;
    }
  }
  ExpectParamsMatch(reference);
  ExpectBiasGradientIsTheMeanOf(step - 1);
}

// The same sweep with the control messages on a transport of their own
// beside the data's, as a GPU worker sends them over TCP beside NCCL: a
// failure at every call of either leaves the failure-free parameters.
class StepAtomicitySplitControlTest : public StepAtomicityTest {
 protected:
  bool SplitControl() const override { return true; }
};

TEST_F(StepAtomicitySplitControlTest,
       AFailureAtEveryTransportCallLeavesTheFailureFreeParameters) {
  SweepEveryTransportCall();
}

// And with the control messages passed along a chain (a control tree of
// fanout 1: 0 - 1 - 2), as a GPU job's pass along a tree past 17 workers:
// rank 1 passes every gather up and every broadcast on, and a failure at
// any of its calls (or of the others') still leaves the failure-free
// parameters.
using StepAtomicityControlChainTest = ControlChain<StepAtomicityTest>;

TEST_F(StepAtomicityControlChainTest,
       AFailureAtEveryTransportCallLeavesTheFailureFreeParameters) {
  SweepEveryTransportCall();
}

class StepStallTest : public StepAtomicityTest {
 protected:
  absl::Duration IoTimeout() const override { return absl::Milliseconds(300); }
};

// A peer that stalls past the I/O timeout at the vote, the decision or the
// confirmation (a SIGSTOPped worker, then SIGCONT): the step commits on
// every rank or on none, and the retries finish it exactly once.
TEST_F(StepStallTest, AStallAtTheCommitPhasesCommitsOnceOrNowhere) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ReferenceSteps reference;
  int64_t step = 0;
  const std::vector<int64_t> calls = ProbeEachWorker(&step, &reference);
  // The last calls of a step are the commit phases': rank 0 receives two
  // votes, broadcasts the decision, receives two confirmations and
  // broadcasts that all confirmed; the others send and receive one each.
  for (const int w : {0, 2}) {
    const int64_t phases = w == 0 ? 6 : 4;
    for (int64_t call = calls[w] - phases; call < calls[w]; ++call) {
      SetFault(w,
               {.step = step, .call = call, .stall = absl::Milliseconds(700)});
      RunTrainerLoops(step, step + 1);
      reference.Step(step);
      reference.Step(step + 1);
      step += 2;
      SetFault(w, {});
      ASSERT_FALSE(HasFailure()) << "stall at call " << call << " of " << w;
    }
  }
  ExpectParamsMatch(reference);
  ExpectBiasGradientIsTheMeanOf(step - 1);
}

// The same stalls on a chain of control messages (0 - 1 - 2), at rank 1,
// which passes each of the four commit messages on: it receives and
// sends one of each, eight calls. Its neighbors on either side time out
// on it; the step still commits on every rank or on none.
using StepStallControlChainTest = ControlChain<StepStallTest>;

TEST_F(StepStallControlChainTest, AStallOfTheMiddleRankCommitsOnceOrNowhere) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ReferenceSteps reference;
  int64_t step = 0;
  const std::vector<int64_t> calls = ProbeEachWorker(&step, &reference);
  for (int64_t call = calls[1] - 8; call < calls[1]; ++call) {
    SetFault(1, {.step = step, .call = call, .stall = absl::Milliseconds(700)});
    RunTrainerLoops(step, step + 1);
    reference.Step(step);
    reference.Step(step + 1);
    step += 2;
    SetFault(1, {});
    ASSERT_FALSE(HasFailure()) << "stall at call " << call << " of 1";
  }
  ExpectParamsMatch(reference);
  ExpectBiasGradientIsTheMeanOf(step - 1);
}

// A wedge once seen: rank 0 finished the step and a peer failed at its very
// last call. The peer's retry finishes (already applied, nothing twice)
// once rank 0's trainer goes on; before, rank 0 answered already_applied,
// went on alone, and the two were refused at different steps for good.
TEST_F(StepAtomicityTest, APeerThatFailedAfterRankZeroFinishedCatchesUp) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ReferenceSteps reference;
  const int64_t calls = ProbeCalls(2, 0);
  reference.Step(0);
  SetFault(2, {.step = 1, .call = calls - 1});
  const std::vector<int> failures = RunTrainerLoops(1, 3);
  EXPECT_GE(failures[2], 1);
  for (int64_t s = 1; s <= 3; ++s) reference.Step(s);
  ExpectParamsMatch(reference);
  ExpectBiasGradientIsTheMeanOf(3);
}

// A trainer's call cancelled (or past its deadline) before the vote: the
// step aborts on every worker with nothing applied, naming why; the retry
// runs it once. Among several workers each step's updates go into the
// parameters as they land, before the votes (those a worker's own stream
// orders: its stacks' and the ones broadcast to it), so the abort puts them
// back as they were, bit for bit.
TEST_F(StepAtomicityTest, ACallCancelledBeforeTheVoteAbortsTheStepEverywhere) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ReferenceSteps reference;
  WriteGradients(0);
  for (const auto& r : StepEverywhere(0)) ASSERT_TRUE(r.ok()) << r.status();
  reference.Step(0);
  WriteGradients(1);
  std::vector<std::map<std::string, std::vector<float>>> before;
  for (const Trainer& t : trainers_) before.push_back(t.param);
  std::map<std::string, std::vector<float>> at_votes;
  engines_[0]->set_step_hook([&](StepPoint point, int64_t step, int) {
    if (point == StepPoint::kPrepared && step == 1) {
      at_votes = trainers_[0].param;
    }
  });
  // Worker 1's caller gives up after the round opened, once its updates are
  // staged: it votes no.
  const std::vector<absl::StatusOr<StepResponse>> out =
      StepEverywhere(1, nullptr, CancelledAfterOneAsk(1));
  engines_[0]->set_step_hook(nullptr);
  EXPECT_EQ(out[1].status().code(), absl::StatusCode::kCancelled)
      << out[1].status();
  for (const int w : {0, 2}) {
    EXPECT_EQ(out[w].status().code(), absl::StatusCode::kAborted)
        << out[w].status();
    EXPECT_TRUE(absl::StrContains(out[w].status().message(), "\"w1\""))
        << out[w].status();
  }
  ASSERT_FALSE(at_votes.empty());
  int applied = 0;
  for (const auto& [name, p] : at_votes) {
    applied += p != before[0].at(name) ? 1 : 0;
  }
  EXPECT_GT(applied, 0) << "no update was in rank 0's parameters at the votes";
  for (int w = 0; w < kWorkers; ++w) {
    EXPECT_EQ(trainers_[w].param, before[w]) << "worker " << w;
  }
  EXPECT_EQ(engines_[0]->last_step(), 0);
  for (const auto& r : StepEverywhere(1)) ASSERT_TRUE(r.ok()) << r.status();
  reference.Step(1);
  ExpectParamsMatch(reference);
  ExpectBiasGradientIsTheMeanOf(1);
}

// With the trainers' step records lent, as a worker's successor reads them.
class StepAtomicityRecordTest : public StepAtomicityTest {
 protected:
  bool LendsRecord() const override { return true; }

  // No trainer's record says its parameters hold part of a step, and each
  // says they hold step `applied` (or `applied` + 1 with `or_next`: a rank
  // that committed a step its peers failed).
  void ExpectWholeRecords(int64_t applied, bool or_next = false) {
    for (int w = 0; w < kWorkers; ++w) {
      const StepRecord r = StepRecordFromWords(trainers_[w].record.data());
      EXPECT_EQ(r.torn(), -1) << "trainer " << w << " applying " << r.applying
                              << ", applied " << r.applied;
      if (!or_next || r.applied != applied + 1) {
        EXPECT_EQ(r.applied, applied) << "trainer " << w;
      }
    }
  }
};

// A step that fails anywhere (at each transport call of rank 0, at the
// votes), whether or not a worker had applied updates early by then, leaves
// no trainer's record saying its parameters hold part of it: a successor of
// any worker would otherwise take whole parameters for torn ones. The
// retries end bit for bit.
TEST_F(StepAtomicityRecordTest, AFailedStepLeavesNoRecordOfPartOfIt) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ReferenceSteps reference;
  int64_t step = 0;
  const int64_t calls = ProbeCalls(0, step);
  reference.Step(step++);
  ASSERT_NO_FATAL_FAILURE(ExpectWholeRecords(0));
  for (int64_t call = 0; call < calls; ++call) {
    SetFault(0, {.step = step, .call = call});
    WriteGradients(step);
    int failed = 0;
    for (const auto& r : StepEverywhere(step)) failed += r.ok() ? 0 : 1;
    SetFault(0, {});
    EXPECT_GT(failed, 0) << "call " << call;
    ASSERT_NO_FATAL_FAILURE(ExpectWholeRecords(step - 1, /*or_next=*/true))
        << "call " << call;
    // Retried until every trainer has it (a rank that committed answers
    // already_applied).
    RunTrainerLoops(step, step);
    ASSERT_NO_FATAL_FAILURE(ExpectWholeRecords(step));
    reference.Step(step++);
  }
  // Refused at the votes after the others applied theirs.
  WriteGradients(step);
  for (const auto& r : StepEverywhere(step, nullptr, CancelledAfterOneAsk(1))) {
    EXPECT_FALSE(r.ok());
  }
  ASSERT_NO_FATAL_FAILURE(ExpectWholeRecords(step - 1));
  RunTrainerLoops(step, step);
  reference.Step(step);
  ASSERT_NO_FATAL_FAILURE(ExpectWholeRecords(step));
  ExpectParamsMatch(reference);
}

// A worker that voted and lost the decision keeps the step staged through
// a new plan version (same owners): the retry commits it from staging.
TEST_F(StepAtomicityTest, AStepInDoubtSurvivesANewPlanVersion) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ReferenceSteps reference;
  const int64_t calls = ProbeCalls(1, 0);
  reference.Step(0);
  // Worker 1's decision broadcast (its third call from the end).
  SetFault(1, {.step = 1, .call = calls - 3});
  WriteGradients(1);
  const std::vector<absl::StatusOr<StepResponse>> out = StepEverywhere(1);
  ASSERT_FALSE(out[1].ok());
  EXPECT_TRUE(absl::StrContains(out[1].status().message(), "keeps the step"))
      << out[1].status();
  EXPECT_EQ(engines_[1]->last_step(), 0);
  EXPECT_EQ(engines_[0]->last_step(), 1);  // rank 0 decided and committed
  ASSERT_NO_FATAL_FAILURE(
      SetPlanEverywhere(PlanWithOwners(2, kWorkers), kSmallBuckets));
  for (const auto& r : StepEverywhere(1)) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->already_applied);
  }
  EXPECT_EQ(engines_[1]->last_step(), 1);
  reference.Step(1);
  RunTrainerLoops(2, 3);
  reference.Step(2);
  reference.Step(3);
  ExpectParamsMatch(reference);
}

// Status and heartbeats never wait for a step: SetDataPlaneSecret (which
// the agent calls when it re-joins, on its heartbeat thread) and
// last_step() answer at once while a step waits on its peers.
TEST_F(StepAtomicityTest, SecretAndLastStepNeverWaitForAStepInProgress) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  WriteGradients(0);
  v1::StepRequest request;
  request.set_step_id(0);
  request.set_lr(-1);
  request.set_weight_decay(-1);
  std::thread waiting([&] { (void)StepFromProto(*engines_[0], request); });
  absl::SleepFor(absl::Milliseconds(200));  // rank 0 waits for the others
  const absl::Time asked = absl::Now();
  engines_[0]->SetDataPlaneSecret(transport::kLoopbackSecret);
  EXPECT_EQ(engines_[0]->last_step(), -1);
  EXPECT_LT(absl::Now() - asked, absl::Milliseconds(100));
  waiting.join();
}

class StepPlanChangeTest : public StepAtomicityTest {
 protected:
  absl::Duration IoTimeout() const override { return absl::Seconds(10); }
};

// A peer frozen mid-step (its call stalls 3 s, the I/O timeout is 10 s)
// whose lease then expires: the plan that drops it, handed to the others
// from another thread (the agent's) while their steps wait on it, aborts
// those steps at once without waiting for the step lock. They fail with
// UNAVAILABLE naming the lost worker and the plan's reason, nothing is
// applied, and every retry is refused at once until the new plan is set.
TEST_F(StepPlanChangeTest, APlanDroppingAFrozenPeerFailsTheStepAtOnceNamingIt) {
  ASSERT_NO_FATAL_FAILURE(SetUpJob());
  ReferenceSteps reference;
  const int64_t calls = ProbeCalls(2, 0);
  reference.Step(0);
  SetFault(2, {.step = 1, .call = calls / 2, .stall = absl::Seconds(3)});
  std::vector<int> owners;
  for (size_t m = 0; m < Matrices().size(); ++m)
    owners.push_back(static_cast<int>(m % 2));
  v1::Plan next = PlanWithOwnerList(2, owners, /*workers=*/2);
  next.set_reason("lease expired: w2");
  WriteGradients(1);
  v1::StepRequest request;
  request.set_step_id(1);
  request.set_lr(-1);
  request.set_weight_decay(-1);
  request.set_adamw_lr(-1);
  std::vector<absl::StatusOr<StepResponse>> out(kWorkers,
                                                absl::UnknownError("not run"));
  std::vector<absl::Duration> took(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      const absl::Time start = absl::Now();
      out[w] = StepFromProto(*engines_[w], request);
      took[w] = absl::Now() - start;
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // 0 and 1 wait on 2
  const absl::Time asked = absl::Now();
  // Rank 1 first: at this call it waits on rank 0 (which waits on the
  // frozen rank 2), so rank 0's aborted transport, closing, would fail its
  // step before its own plan arrived, and it could not name the plan.
  EXPECT_TRUE(engines_[1]->AbortForPlan(MembershipFromProto(next)));
  EXPECT_TRUE(engines_[0]->AbortForPlan(MembershipFromProto(next)));
  EXPECT_LT(absl::Now() - asked, absl::Milliseconds(100));
  for (std::thread& t : threads) t.join();
  const std::string reason =
      "plan version 1 replaced by 2: worker \"w2\" left the job (lease "
      "expired: w2)";
  for (int w = 0; w < 2; ++w) {
    std::cerr << "worker " << w << " failed after " << took[w] << ": "
              << out[w].status() << "\n";
    EXPECT_LT(took[w], absl::Seconds(1.5));
    ASSERT_FALSE(out[w].ok());
    EXPECT_TRUE(absl::IsUnavailable(out[w].status())) << out[w].status();
    EXPECT_TRUE(absl::StrContains(out[w].status().message(), reason))
        << out[w].status();
    EXPECT_TRUE(absl::StrContains(out[w].status().message(),
                                  "step 1 was not applied on this worker"))
        << out[w].status();
  }
  EXPECT_FALSE(out[2].ok());
  for (int w = 0; w < kWorkers; ++w) EXPECT_EQ(engines_[w]->last_step(), 0);
  ExpectParamsMatch(reference);
  // No step runs on the replaced plan's transport (its peer is gone).
  const absl::Time retried = absl::Now();
  const absl::StatusOr<StepResponse> retry =
      StepFromProto(*engines_[0], request);
  EXPECT_LT(absl::Now() - retried, absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsUnavailable(retry.status())) << retry.status();
  EXPECT_TRUE(absl::StrContains(retry.status().message(), reason))
      << retry.status();
  EXPECT_FALSE(engines_[0]->AbortForPlan(
      MembershipFromProto(next)));  // once per plan version
  EXPECT_TRUE(
      SetPlanFromProto(*engines_[0], Job(0, kSmallBuckets), next, addresses_)
          .ok());
  EXPECT_FALSE(engines_[0]->AbortForPlan(MembershipFromProto(next)));
}

}  // namespace
}  // namespace worker
}  // namespace muonps
