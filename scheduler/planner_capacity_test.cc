// Tests of the ownership planner (planner.h) on instances built by hand:
// memory capacity (spreading, packing, and naming the shortfall), bad input
// rejected naming its culprit, and batching along measured batch curves.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/cost_table.h"
#include "scheduler/plan_test_util.h"
#include "scheduler/planner.h"

namespace muonps {
namespace scheduler {
namespace {

using plan_test::BruteForce;
using plan_test::CountOn;
using plan_test::ExpectValidPlan;
using plan_test::kGiB;
using plan_test::kRel;
using plan_test::Worker;

// ---- Memory capacity ----

MatrixSpec Square(const std::string& name, int64_t dim) {
  MatrixSpec m;
  m.name = name;
  m.rows = dim;
  m.cols = dim;
  return m;
}

// Both algorithms measured alike, so the policy cannot fall back to the
// roofline for the other one.
std::shared_ptr<const CostTable> CurveTable(
    const std::vector<std::tuple<int64_t, int64_t, double>>& points) {
  auto table = std::make_shared<CostTable>();
  for (const auto& [dim, batch, seconds] : points) {
    for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
      const absl::Status added = table->Add(dim, dim, a, batch, seconds);
      EXPECT_TRUE(added.ok()) << added;
    }
  }
  return table;
}

TEST(PlannerCapacityTest, SpreadsMatricesThatFitOnlyWhenSpread) {
  // A 4x faster worker with a flat batch curve would take all four; its
  // memory holds two.
  const auto table = CurveTable({{1024, 1, 0.010}, {1024, 4, 0.011}});
  PlanInput input;
  input.options.workspace_bytes = kGiB;
  const int64_t owned = OwnedBytes(Square("x", 1024));
  for (int i = 0; i < 4; ++i) {
    input.matrices.push_back(Square(absl::StrCat("m", i), 1024));
  }
  input.workers = {Worker("fast", kGiB + 2 * owned + 1, 4.0, table),
                   Worker("slow", kGiB + 2 * owned + 1, 1.0, table)};
  PlanInput roomy = input;
  for (WorkerSpec& w : roomy.workers) w.memory_bytes = 80 * kGiB;
  const absl::StatusOr<OwnershipPlan> unconstrained = PlanOwnership(roomy);
  ASSERT_TRUE(unconstrained.ok()) << unconstrained.status();
  EXPECT_EQ(CountOn(*unconstrained, 0), 4);

  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
  EXPECT_EQ(CountOn(*plan, 0), 2);
  EXPECT_EQ(CountOn(*plan, 1), 2);
}

TEST(PlannerCapacityTest, FindsThePackingWhenOnlyOneExists) {
  // Owned bytes in the ratio 3 : 2 and workers that hold 6 each: only
  // {big, big} and {small, small, small} fit. Alternating by cost puts one
  // big and one small on each worker and leaves no room for the last small.
  PlanInput input;
  input.options.workspace_bytes = kGiB;
  MatrixSpec big = Square("big0", 1024);
  big.cols = 3072;
  MatrixSpec small = Square("small0", 1024);
  small.cols = 2048;
  ASSERT_EQ(2 * OwnedBytes(big), 3 * OwnedBytes(small));
  input.matrices = {big, big, small, small, small};
  input.matrices[1].name = "big1";
  input.matrices[3].name = "small1";
  input.matrices[4].name = "small2";
  const int64_t capacity = 2 * OwnedBytes(big);
  input.workers = {Worker("w0", kGiB + capacity),
                   Worker("w1", kGiB + capacity)};
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
  EXPECT_EQ(plan->owners[0], plan->owners[1]);
  EXPECT_EQ(plan->owners[2], plan->owners[3]);
  EXPECT_EQ(plan->owners[2], plan->owners[4]);
}

TEST(PlannerCapacityTest, TooLittleTotalMemoryNamesMatrixWorkerAndShortfall) {
  PlanInput input;
  input.options.workspace_bytes = kGiB;
  const int64_t owned = OwnedBytes(Square("x", 2048));
  // Each worker holds one matrix and half of another.
  const int64_t capacity = owned + owned / 2;
  for (int i = 0; i < 3; ++i) {
    input.matrices.push_back(Square(absl::StrCat("m", i), 2048));
  }
  input.workers = {Worker("w0", kGiB + capacity),
                   Worker("w1", kGiB + capacity)};
  const std::string short_by =
      absl::StrCat("short by ", owned - (capacity - owned));
  for (const absl::StatusOr<OwnershipPlan>& plan :
       {PlanOwnership(input), Replan(input, OwnershipPlan{})}) {
    ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted)
        << plan.status();
    const std::string message(plan.status().message());
    EXPECT_TRUE(message.find("matrix \"m0\"") != std::string::npos ||
                message.find("matrix \"m1\"") != std::string::npos ||
                message.find("matrix \"m2\"") != std::string::npos)
        << message;
    EXPECT_TRUE(message.find("worker \"w0\"") != std::string::npos ||
                message.find("worker \"w1\"") != std::string::npos)
        << message;
    EXPECT_NE(message.find(short_by), std::string::npos)
        << message << " lacks " << short_by;
  }
}

// Where the owning workers hold less than the matrices together, the
// input is refused before any placement runs, saying both sums; a leaving
// worker's memory does not count.
TEST(PlannerCapacityTest, TooLittleMemoryInAllIsSaidBeforePlacing) {
  PlanInput input;
  input.options.workspace_bytes = kGiB;
  const int64_t owned = OwnedBytes(Square("x", 2048));
  const int64_t capacity = owned + owned / 4;  // 2.5 matrices in all
  for (int i = 0; i < 3; ++i) {
    input.matrices.push_back(Square(absl::StrCat("m", i), 2048));
  }
  input.workers = {Worker("w0", kGiB + capacity), Worker("w1", kGiB + capacity),
                   Worker("leaving", kGiB + 8 * capacity)};
  input.workers[2].owns_nothing = true;
  const std::string said =
      absl::StrCat("matrices: need ", 3 * owned,
                   " bytes to own; the 2 workers that may "
                   "own hold ",
                   2 * capacity, " together beside their workspaces");
  for (const absl::StatusOr<OwnershipPlan>& plan :
       {PlanOwnership(input), PlanFlopLpt(input), PlanRoundRobin(input),
        Replan(input, OwnershipPlan{})}) {
    ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted)
        << plan.status();
    EXPECT_NE(plan.status().message().find(said), absl::string_view::npos)
        << plan.status() << " lacks " << said;
  }
}

// Memory sums that would overflow an int64 saturate: workers of nearly
// the largest memory plan as any others.
TEST(PlannerCapacityTest, HugeMemoriesDoNotOverflowTheSums) {
  PlanInput input;
  input.options.workspace_bytes = kGiB;
  input.matrices = {Square("a", 64), Square("b", 64)};
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2;
  input.workers = {Worker("w0", huge), Worker("w1", huge), Worker("w2", huge)};
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
}

TEST(PlannerCapacityTest, MatrixLargerThanEveryWorkerIsNamed) {
  PlanInput input;
  input.options.workspace_bytes = kGiB;
  input.matrices = {Square("small", 64), Square("huge", 8192)};
  input.workers = {Worker("w0", kGiB + 512 * (int64_t{1} << 20)),
                   Worker("w1", kGiB + 256 * (int64_t{1} << 20))};
  for (const absl::StatusOr<OwnershipPlan>& plan :
       {PlanOwnership(input), PlanFlopLpt(input), PlanRoundRobin(input),
        Replan(input, OwnershipPlan{})}) {
    ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted)
        << plan.status();
    EXPECT_NE(plan.status().message().find("matrix \"huge\""),
              absl::string_view::npos)
        << plan.status();
  }
}

// ---- Bad input ----

struct BadInput {
  std::string what;
  std::function<void(PlanInput*)> spoil;
  std::string names;  // the message must contain this
};

TEST(PlannerBadInputTest, EveryEntryPointRejectsBadInputNamingTheCulprit) {
  PlanInput good;
  MatrixSpec q = Square("layers.0.q", 128);
  q.cols = 64;
  MatrixSpec k = Square("layers.0.k", 32);
  good.matrices = {q, k};
  good.workers = {Worker("w0", 80 * kGiB), Worker("w1", 80 * kGiB)};
  const absl::StatusOr<OwnershipPlan> previous = PlanOwnership(good);
  ASSERT_TRUE(previous.ok()) << previous.status();
  const std::string k_named = "matrix \"layers.0.k\"";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t workspace = good.options.workspace_bytes;
  const std::vector<BadInput> cases = {
      {"rows 0", [](PlanInput* in) { in->matrices[1].rows = 0; }, k_named},
      {"rows -5", [](PlanInput* in) { in->matrices[1].rows = -5; }, k_named},
      {"cols 0", [](PlanInput* in) { in->matrices[1].cols = 0; }, k_named},
      {"cols -1", [](PlanInput* in) { in->matrices[1].cols = -1; }, k_named},
      {"experts 0", [](PlanInput* in) { in->matrices[1].experts = 0; },
       k_named},
      {"layer -1", [](PlanInput* in) { in->matrices[1].layer = -1; }, k_named},
      {"empty name", [](PlanInput* in) { in->matrices[1].name.clear(); },
       "matrices[1]"},
      {"duplicate name",
       [](PlanInput* in) { in->matrices[1].name = in->matrices[0].name; },
       "matrix \"layers.0.q\""},
      {"no workers", [](PlanInput* in) { in->workers.clear(); }, "workers"},
      {"empty worker id", [](PlanInput* in) { in->workers[1].id.clear(); },
       "workers[1]"},
      {"duplicate worker id", [](PlanInput* in) { in->workers[1].id = "w0"; },
       "worker \"w0\""},
      {"speed 0", [](PlanInput* in) { in->workers[1].speed = 0; },
       "worker \"w1\""},
      {"speed -1", [](PlanInput* in) { in->workers[1].speed = -1; },
       "worker \"w1\""},
      {"speed NaN", [nan](PlanInput* in) { in->workers[1].speed = nan; },
       "worker \"w1\""},
      {"speed inf", [inf](PlanInput* in) { in->workers[1].speed = inf; },
       "worker \"w1\""},
      {"memory equal to workspace",
       [workspace](PlanInput* in) { in->workers[1].memory_bytes = workspace; },
       "worker \"w1\""},
      {"memory below workspace",
       [](PlanInput* in) { in->workers[1].memory_bytes = 1; }, "worker \"w1\""},
      {"ns_steps 0", [](PlanInput* in) { in->options.ns_steps = 0; },
       "ns_steps"},
  };
  for (const BadInput& c : cases) {
    SCOPED_TRACE(c.what);
    PlanInput input = good;
    c.spoil(&input);
    const absl::Status status = PlanOwnership(input).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(c.names), absl::string_view::npos)
        << status << " does not name " << c.names;
    EXPECT_EQ(PlanFlopLpt(input).status(), status);
    EXPECT_EQ(PlanRoundRobin(input).status(), status);
    EXPECT_EQ(Replan(input, *previous).status(), status);
  }
}

// ---- Batching ----

// 1024^2 matrices whose batch of 8 costs twice one matrix: strongly concave.
std::shared_ptr<const CostTable> ConcaveTable() {
  return CurveTable({{1024, 1, 0.010}, {1024, 8, 0.020}});
}

PlanInput SameShapeOnTwoWorkers(std::shared_ptr<const CostTable> table,
                                int matrices) {
  PlanInput input;
  for (int i = 0; i < matrices; ++i) {
    input.matrices.push_back(Square(absl::StrCat("a", i), 1024));
  }
  input.workers = {Worker("w0", 80 * kGiB, 1.0, table),
                   Worker("w1", 80 * kGiB, 1.0, table)};
  return input;
}

TEST(PlannerBatchingTest, ConcaveCurveKeepsSameShapeMatricesInFullBatches) {
  const PlanInput input = SameShapeOnTwoWorkers(ConcaveTable(), 8);
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  const absl::StatusOr<OwnershipPlan> lpt = PlanFlopLpt(input);
  ASSERT_TRUE(plan.ok() && lpt.ok()) << plan.status() << lpt.status();
  ExpectValidPlan(input, *plan);
  ASSERT_EQ(plan->batches.size(), 2u);
  for (const Batch& b : plan->batches) EXPECT_GE(b.items.size(), 4u);
  EXPECT_LE(plan->max_seconds, lpt->max_seconds * (1 + kRel));
  EXPECT_NEAR(plan->max_seconds, BruteForce(input).max_seconds,
              kRel * plan->max_seconds);
}

TEST(PlannerBatchingTest, ConcaveCurveBatchesAllRatherThanSplitByFlops) {
  // 512^2 has an eighth of the FLOPs of 1024^2 but is measured slow and
  // linear: one worker should batch all eight 1024^2 (20 ms) and the other
  // run the 512^2 (15 ms). FLOP-LPT splits them 4/4 and adds the 512^2.
  auto table = std::make_shared<CostTable>(*ConcaveTable());
  for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    ASSERT_TRUE(table->Add(512, 512, a, 1, 0.015).ok());
    ASSERT_TRUE(table->Add(512, 512, a, 2, 0.030).ok());
  }
  PlanInput input = SameShapeOnTwoWorkers(table, 8);
  input.matrices.push_back(Square("b", 512));
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  const absl::StatusOr<OwnershipPlan> lpt = PlanFlopLpt(input);
  ASSERT_TRUE(plan.ok() && lpt.ok()) << plan.status() << lpt.status();
  ExpectValidPlan(input, *plan);
  size_t largest_batch = 0;
  for (const Batch& b : plan->batches) {
    largest_batch = std::max(largest_batch, b.items.size());
  }
  EXPECT_EQ(largest_batch, 8u);
  EXPECT_NEAR(plan->max_seconds, BruteForce(input).max_seconds,
              kRel * plan->max_seconds);
  EXPECT_LT(plan->max_seconds, 0.8 * lpt->max_seconds);
}

TEST(PlannerBatchingTest, LinearCurveSplitsSameShapeMatricesEvenly) {
  const PlanInput input = SameShapeOnTwoWorkers(
      CurveTable({{1024, 1, 0.010}, {1024, 8, 0.080}}), 8);
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
  EXPECT_EQ(CountOn(*plan, 0), 4);
  EXPECT_EQ(CountOn(*plan, 1), 4);
}

// Timing noise can make a measured batch cost more than its parts (here 2
// matrices 3 ms, one 1 ms); a lower bound must still be below what the
// plan achieves (1 ms each on two workers).
TEST(PlannerBatchingTest, LowerBoundStaysBelowThePlanForASuperadditiveCurve) {
  const PlanInput input = SameShapeOnTwoWorkers(
      CurveTable({{1024, 1, 0.001}, {1024, 2, 0.003}}), 2);
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(CountOn(*plan, 0), 1);
  EXPECT_LE(plan->lower_bound, plan->max_seconds * (1 + 1e-12));
}

TEST(PlannerBatchingTest, TwiceAsFastWorkerGetsAboutTwiceAsManyMatrices) {
  PlanInput input;
  for (int i = 0; i < 12; ++i) {
    MatrixSpec m = Square(absl::StrCat("m", i), 4096);
    m.dtype = DType::kBFloat16;
    input.matrices.push_back(m);
  }
  input.workers = {Worker("fast", 80 * kGiB, 2.0),
                   Worker("slow", 80 * kGiB, 1.0)};
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
  EXPECT_GE(CountOn(*plan, 0), 7);
  EXPECT_LE(CountOn(*plan, 0), 9);
  EXPECT_EQ(CountOn(*plan, 0) + CountOn(*plan, 1), 12);
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
