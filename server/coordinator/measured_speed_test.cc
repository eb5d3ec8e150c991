// Measured speeds: each GPU worker's Newton-Schulz as its steps measure it
// against the plan's prediction (MeasuredSpeed), the rule that turns
// unequal ranks into a re-plan once (RebalanceByMeasurement), and the
// coordinator doing it: reports of a rank that runs slower than its cost
// table make the lease monitor publish a plan that gives it less, named by
// its reason and shown by ListWorkers; a plan that already used what the
// ranks measure is not re-planned again; CPU workers, reports of older
// plans and a tolerance of 0 never re-plan.
#include "server/coordinator/measured_speed.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_fixture.h"

namespace muonps {
namespace coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

StepStats Stats(int64_t version, double measured, double predicted,
                double step = 1.0) {
  StepStats s;
  s.plan_version = version;
  s.ns_seconds = measured;
  s.predicted_ns_seconds = predicted;
  s.step_seconds = step;
  return s;
}

TEST(MeasuredSpeedTest, EstimatesTheFactorFromTheMedianOfItsWindow) {
  MeasuredSpeed speed;
  EXPECT_EQ(speed.factor(), 1.0);
  EXPECT_FALSE(speed.measured());
  // Four steps at 1.25x the prediction and one outlier.
  for (int i = 0; i < 4; ++i) speed.Add(Stats(1, 0.125, 0.1));
  EXPECT_FALSE(speed.measured());
  speed.Add(Stats(1, 10.0, 0.1));
  ASSERT_TRUE(speed.measured());
  EXPECT_DOUBLE_EQ(speed.MedianSeconds(), 0.125);
  EXPECT_DOUBLE_EQ(speed.Estimate(), 0.8);
  // The window keeps the newest five.
  for (int i = 0; i < 5; ++i) speed.Add(Stats(1, 0.05, 0.1));
  EXPECT_DOUBLE_EQ(speed.Estimate(), 2.0);
}

TEST(MeasuredSpeedTest, CountsOnlyStepsOfPlansThatUsedItsFactor) {
  MeasuredSpeed speed;
  speed.Set(0.8, 4);
  EXPECT_EQ(speed.since_version(), 4);
  for (int i = 0; i < 5; ++i) speed.Add(Stats(3, 0.2, 0.1));  // older plan
  speed.Add(Stats(4, 0, 0.1));                                // no time
  speed.Add(Stats(4, 0.1, 0));                                // owns nothing
  EXPECT_FALSE(speed.measured());
  // Under a plan at 0.8, its prediction already runs 1 / 0.8 longer.
  for (int i = 0; i < 5; ++i) speed.Add(Stats(5, 0.125, 0.125));
  ASSERT_TRUE(speed.measured());
  EXPECT_DOUBLE_EQ(speed.Estimate(), 0.8);
}

// Ranks measured at `ratios` (measured / predicted) of one plan, each
// predicted at `predicted` seconds.
std::vector<MeasuredSpeed> Measured(const std::vector<double>& ratios,
                                    double predicted = 0.1) {
  std::vector<MeasuredSpeed> out(ratios.size());
  for (size_t r = 0; r < ratios.size(); ++r) {
    for (int i = 0; i < MeasuredSpeed::kWindow; ++i) {
      out[r].Add(Stats(1, predicted * ratios[r], predicted));
    }
  }
  return out;
}

std::vector<RankSpeed> Ranks(const std::vector<MeasuredSpeed>& speeds) {
  std::vector<RankSpeed> out;
  for (size_t r = 0; r < speeds.size(); ++r) {
    out.push_back({absl::StrCat("w", r), &speeds[r], true, true});
  }
  return out;
}

TEST(RebalanceTest, UnequalGpusGetTheirMeasuredFactors) {
  const std::vector<MeasuredSpeed> speeds = Measured({1.25, 1.0});
  const std::optional<Rebalance> r =
      RebalanceByMeasurement(Ranks(speeds), 0.03);
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->factors.size(), 2u);
  EXPECT_DOUBLE_EQ(r->factors[0], 0.8);
  EXPECT_DOUBLE_EQ(r->factors[1], 1.0);
  EXPECT_NEAR(r->imbalance, 1.25 / 1.125 - 1, 1e-12);
  EXPECT_THAT(r->reason, HasSubstr("w0 0.800, w1 1.000"));
  EXPECT_THAT(r->reason, HasSubstr("11.1% above the mean"));
}

TEST(RebalanceTest, WithinToleranceOrAlreadyPlannedSoNoRebalance) {
  // 2% apart: within 3%.
  std::vector<MeasuredSpeed> speeds = Measured({1.02, 1.0});
  EXPECT_FALSE(RebalanceByMeasurement(Ranks(speeds), 0.03).has_value());
  // Unequal, but each as its plan predicted at its factor: the plan is as
  // balanced as it gets.
  speeds = std::vector<MeasuredSpeed>(2);
  speeds[0].Set(0.8, 2);
  speeds[1].Set(1.0, 2);
  for (int i = 0; i < MeasuredSpeed::kWindow; ++i) {
    speeds[0].Add(Stats(2, 0.14, 0.14));
    speeds[1].Add(Stats(2, 0.10, 0.10));
  }
  EXPECT_FALSE(RebalanceByMeasurement(Ranks(speeds), 0.03).has_value());
  // 20% apart, but 0.4 ms: a small model's step, not worth a plan change.
  speeds = Measured({1.2, 1.0}, 0.004);
  EXPECT_FALSE(RebalanceByMeasurement(Ranks(speeds), 0.03).has_value());
  speeds = Measured({1.2, 1.0}, 0.012);
  EXPECT_TRUE(RebalanceByMeasurement(Ranks(speeds), 0.03).has_value());
  // Tolerance 0: never.
  speeds = Measured({2.0, 1.0});
  EXPECT_FALSE(RebalanceByMeasurement(Ranks(speeds), 0).has_value());
}

TEST(RebalanceTest, WaitsForEveryOwnerAndSkipsCpusAndIdleRanks) {
  std::vector<MeasuredSpeed> speeds = Measured({1.5, 1.0, 1.0});
  std::vector<RankSpeed> ranks = Ranks(speeds);
  // A rank that owns nothing keeps its factor and does not count.
  ranks[2].owns = false;
  speeds[2] = MeasuredSpeed();
  std::optional<Rebalance> r = RebalanceByMeasurement(ranks, 0.03);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->factors[2], 1.0);
  EXPECT_THAT(r->reason, Not(HasSubstr("w2")));
  // An owner not measured yet: wait.
  ranks[2].owns = true;
  EXPECT_FALSE(RebalanceByMeasurement(ranks, 0.03).has_value());
  // A CPU owner: its times are the host's load.
  speeds = Measured({1.5, 1.0});
  ranks = Ranks(speeds);
  ranks[1].gpu = false;
  EXPECT_FALSE(RebalanceByMeasurement(ranks, 0.03).has_value());
  // One owner alone has no one to balance with.
  ranks = Ranks(speeds);
  ranks[1].owns = false;
  EXPECT_FALSE(RebalanceByMeasurement(ranks, 0.03).has_value());
}

// Windows of both ranks under `version`: rank r at ratios[r] of its
// prediction and factor factors[r], every step taking `step` seconds.
void Window(std::vector<MeasuredSpeed>& speeds, int64_t version,
            const std::vector<double>& ratios, double step) {
  for (size_t r = 0; r < speeds.size(); ++r) {
    for (int i = 0; i < MeasuredSpeed::kWindow; ++i) {
      speeds[r].Add(Stats(version, 0.1 * ratios[r], 0.1, step));
    }
  }
}

// What a coordinator does with a rebalance: the factors for `version`.
void Apply(std::vector<MeasuredSpeed>& speeds, const Rebalance& r,
           int64_t version) {
  for (size_t i = 0; i < speeds.size(); ++i)
    speeds[i].Set(r.factors[i], version);
}

// The first trial of two ranks 1.25 and 1.0 times their prediction, steps
// of 100 ms, applied as plan version 2.
void FirstTrial(SpeedBalance& balance, std::vector<MeasuredSpeed>& speeds) {
  Window(speeds, 1, {1.25, 1.0}, 0.100);
  const std::optional<Rebalance> r = balance.Consider(Ranks(speeds), 0.03);
  ASSERT_TRUE(r.has_value());
  EXPECT_THAT(r->reason, HasSubstr("step 100.0 ms before"));
  Apply(speeds, *r, 2);
}

TEST(SpeedBalanceTest, AShorterStepKeepsTheTrialOpenALongerOneUndoesIt) {
  SpeedBalance balance;
  std::vector<MeasuredSpeed> speeds(2);
  ASSERT_NO_FATAL_FAILURE(FirstTrial(balance, speeds));
  std::optional<Rebalance> r;
  // Not measured under version 2 yet: nothing.
  EXPECT_FALSE(balance.Consider(Ranks(speeds), 0.03).has_value());
  // 5% shorter, and unequal again: a second trial.
  Window(speeds, 2, {1.0, 1.2}, 0.095);
  r = balance.Consider(Ranks(speeds), 0.03);
  ASSERT_TRUE(r.has_value());
  EXPECT_THAT(r->reason, HasSubstr("step 95.0 ms before"));
  const std::vector<double> before = {speeds[0].factor(), speeds[1].factor()};
  Apply(speeds, *r, 3);
  // 3% longer than 95 ms: undone, back to the factors before.
  Window(speeds, 3, {1.1, 1.0}, 0.098);
  r = balance.Consider(Ranks(speeds), 0.03);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->factors, before);
  EXPECT_THAT(r->reason,
              HasSubstr("lengthened the step (98.0 ms against 95.0"));
  Apply(speeds, *r, 4);
  // Settled, however unequal.
  Window(speeds, 4, {1.5, 1.0}, 0.090);
  EXPECT_FALSE(balance.Consider(Ranks(speeds), 0.03).has_value());
  // Until the ranks change.
  std::vector<RankSpeed> others = Ranks(speeds);
  others[1].worker_id = "w9";
  EXPECT_TRUE(balance.Consider(others, 0.03).has_value());
}

TEST(SpeedBalanceTest, AStepNoShorterSettles) {
  SpeedBalance balance;
  std::vector<MeasuredSpeed> speeds(2);
  ASSERT_NO_FATAL_FAILURE(FirstTrial(balance, speeds));
  // Within 1% of the step before: kept, and no further trial.
  Window(speeds, 2, {1.0, 1.3}, 0.0995);
  EXPECT_FALSE(balance.Consider(Ranks(speeds), 0.03).has_value());
  Window(speeds, 2, {1.0, 1.3}, 0.05);
  EXPECT_FALSE(balance.Consider(Ranks(speeds), 0.03).has_value());
}

}  // namespace

namespace coordinator_test {
namespace {

using ::testing::HasSubstr;

class MeasuredSpeedCoordinatorTest : public CoordinatorTest {
 protected:
  // Job "x" of 16 matrices of 4096 x 4096 (each predicted at milliseconds)
  // on two workers of `kind`.
  void TwoWorkers(const std::string& kind) {
    ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 16, 4096, 4096))).ok());
    for (const char* id : {"w1", "w2"}) {
      v1::JoinJobRequest join = Join("x", id);
      join.mutable_device()->set_kind(kind);
      ASSERT_TRUE(state_->JoinJob(join).ok()) << id;
    }
  }

  // Per worker of `plan`: the predicted seconds of its batches (what a
  // worker reports as predicted_ns_seconds) and its matrices.
  static std::map<std::string, double> Predicted(const v1::Plan& plan) {
    std::map<std::string, double> out;
    for (const v1::Batch& b : plan.batches()) {
      out[b.worker_id()] += b.predicted_seconds();
    }
    return out;
  }
  static std::map<std::string, int> Owned(const v1::Plan& plan) {
    std::map<std::string, int> out;
    for (const v1::Batch& b : plan.batches()) {
      out[b.worker_id()] += b.matrices_size();
    }
    return out;
  }

  // Steps `from`.. of both workers under the current plan, each measuring
  // `slowness` times its prediction, each step `step_seconds` long.
  void Steps(int64_t from, int count,
             const std::map<std::string, double>& slowness,
             double step_seconds = 1) {
    const v1::Plan plan = CurrentPlan("x");
    const std::map<std::string, double> predicted = Predicted(plan);
    for (int64_t step = from; step < from + count; ++step) {
      for (const auto& [id, slow] : slowness) {
        v1::ReportStepStatsRequest r;
        r.set_job("x");
        r.set_worker_id(id);
        r.set_step(step);
        r.set_plan_version(plan.version());
        r.set_step_seconds(step_seconds);
        r.set_predicted_ns_seconds(predicted.at(id));
        r.set_ns_seconds(predicted.at(id) * slow);
        ASSERT_TRUE(state_->ReportStepStats(r).ok());
      }
    }
  }

  double SpeedFactor(const std::string& id) {
    v1::ListWorkersRequest request;
    request.set_job("x");
    absl::StatusOr<v1::ListWorkersResponse> list = state_->ListWorkers(request);
    EXPECT_TRUE(list.ok()) << list.status();
    for (const v1::WorkerInfo& w : list->workers()) {
      if (w.worker_id() == id) return w.speed_factor();
    }
    ADD_FAILURE() << "no " << id;
    return 0;
  }
};

TEST_F(MeasuredSpeedCoordinatorTest, ASlowGpuGetsLessOnceAndNoMoreReplans) {
  TwoWorkers("cuda");
  const v1::Plan first = CurrentPlan("x");
  EXPECT_EQ(Owned(first).at("w1"), 8);
  EXPECT_EQ(SpeedFactor("w1"), 1.0);
  // w1 runs at half its table's speed. Four steps are not a measurement.
  Steps(0, 4, {{"w1", 2.0}, {"w2", 1.0}});
  state_->ExpireLeases();
  EXPECT_EQ(CurrentPlan("x").version(), first.version());
  // The fifth asks for a plan, which the lease monitor makes.
  Steps(4, 1, {{"w1", 2.0}, {"w2", 1.0}});
  EXPECT_EQ(SpeedFactor("w1"), 0.5);
  EXPECT_EQ(SpeedFactor("w2"), 1.0);
  // Reports of the old plan meanwhile change nothing.
  Steps(5, 5, {{"w1", 1.0}, {"w2", 1.0}});
  EXPECT_EQ(SpeedFactor("w1"), 0.5);
  state_->ExpireLeases();
  const v1::Plan second = CurrentPlan("x");
  ASSERT_EQ(second.version(), first.version() + 1);
  EXPECT_THAT(second.reason(), HasSubstr("measured speeds"));
  EXPECT_THAT(second.reason(), HasSubstr("w1 0.500, w2 1.000"));
  // A third of the matrices, give or take one, and momentum moved.
  EXPECT_LE(Owned(second).at("w1"), 6);
  EXPECT_GE(Owned(second).at("w1"), 4);
  EXPECT_GT(second.moved_bytes(), 0);
  // What it measures now is what the plan predicted: no more plans, though
  // the split of 16 equal matrices cannot be exact.
  Steps(10, 20, {{"w1", 1.0}, {"w2", 1.0}});
  state_->ExpireLeases();
  EXPECT_EQ(CurrentPlan("x").version(), second.version());
  EXPECT_EQ(SpeedFactor("w1"), 0.5);
}

TEST_F(MeasuredSpeedCoordinatorTest, APlanThatLengthensTheStepIsUndone) {
  TwoWorkers("cuda");
  const v1::Plan first = CurrentPlan("x");
  Steps(0, 5, {{"w1", 2.0}, {"w2", 1.0}}, 0.1);
  state_->ExpireLeases();
  const v1::Plan second = CurrentPlan("x");
  ASSERT_EQ(second.version(), first.version() + 1);
  EXPECT_THAT(second.reason(), HasSubstr("step 100.0 ms before"));
  // Balanced by what w1 measured, but the step got longer: undone.
  Steps(5, 5, {{"w1", 1.0}, {"w2", 1.0}}, 0.11);
  state_->ExpireLeases();
  const v1::Plan third = CurrentPlan("x");
  ASSERT_EQ(third.version(), second.version() + 1);
  EXPECT_THAT(third.reason(), HasSubstr("lengthened the step (110.0 ms"));
  EXPECT_EQ(SpeedFactor("w1"), 1.0);
  EXPECT_EQ(Owned(third).at("w1"), Owned(first).at("w1"));
  // And no more trials.
  Steps(10, 10, {{"w1", 2.0}, {"w2", 1.0}}, 0.1);
  state_->ExpireLeases();
  EXPECT_EQ(CurrentPlan("x").version(), third.version());
}

TEST_F(MeasuredSpeedCoordinatorTest, CpuWorkersKeepTheirCostTables) {
  TwoWorkers("cpu");
  const int64_t version = CurrentPlan("x").version();
  Steps(0, 10, {{"w1", 2.0}, {"w2", 1.0}});
  state_->ExpireLeases();
  EXPECT_EQ(CurrentPlan("x").version(), version);
  EXPECT_EQ(SpeedFactor("w1"), 1.0);
}

TEST_F(MeasuredSpeedCoordinatorTest, ToleranceZeroKeepsTheCostTables) {
  CoordinatorOptions options = Options();
  options.rebalance_tolerance = 0;
  Reset(options);
  TwoWorkers("cuda");
  const int64_t version = CurrentPlan("x").version();
  Steps(0, 10, {{"w1", 2.0}, {"w2", 1.0}});
  state_->ExpireLeases();
  EXPECT_EQ(CurrentPlan("x").version(), version);
}

TEST_F(MeasuredSpeedCoordinatorTest, ARejoinedWorkerStartsFromItsTable) {
  TwoWorkers("cuda");
  Steps(0, 5, {{"w1", 2.0}, {"w2", 1.0}});
  state_->ExpireLeases();
  EXPECT_EQ(SpeedFactor("w1"), 0.5);
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w1")).ok());
  JoinOk("x", "w1");
  EXPECT_EQ(SpeedFactor("w1"), 1.0);
}

}  // namespace
}  // namespace coordinator_test
}  // namespace coordinator
}  // namespace muonps
