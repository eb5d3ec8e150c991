// BatchSplitter (scheduler/cost_model.h) and the plans it shapes: a batch
// splits where the measured times make the whole slower than its parts by
// more than kSplitMargin, never without a table, and the planner's Batch
// carries the parts and their predicted times.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/cost_model.h"
#include "scheduler/planner.h"

namespace muonps {
namespace scheduler {
namespace {

constexpr double kTol = 1e-12;

// (batch, ns5 seconds, gram seconds) of 1024 x 1024 matrices.
using Points = std::vector<std::tuple<int64_t, double, double>>;

std::shared_ptr<const CostTable> SquareTable(const Points& points) {
  auto table = std::make_shared<CostTable>();
  for (const auto& [batch, ns5, gram] : points) {
    EXPECT_TRUE(table->Add(1024, 1024, NsAlgorithm::kNs5, batch, ns5).ok());
    EXPECT_TRUE(table->Add(1024, 1024, NsAlgorithm::kGram, batch, gram).ok());
  }
  return table;
}

// NS5 everywhere faster than Gram (which costs 1.5x); batch 16 takes
// `at16` seconds against 2 x 7 ms for two batches of 8.
std::shared_ptr<const CostTable> SixteenAt(double at16) {
  return SquareTable({{1, 0.0010, 0.0015},
                      {2, 0.0019, 0.00285},
                      {4, 0.0036, 0.0054},
                      {8, 0.0070, 0.0105},
                      {16, at16, 1.5 * at16}});
}

void ExpectParts(const BatchParts& got, const std::vector<BatchPart>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(got[i].count, want[i].count);
    EXPECT_EQ(got[i].algorithm, want[i].algorithm);
    EXPECT_NEAR(got[i].seconds, want[i].seconds, kTol);
  }
}

TEST(BatchSplitterTest, SixteenSlowerThanTwoEightsSplitsIntoTwoEights) {
  const CostModel model(SixteenAt(0.016), DeviceRates{}, 1.0, 5);
  BatchSplitter splitter(model, 1024, 1024, AlgorithmPolicy::kAuto);
  ExpectParts(splitter.Parts(16),
              {{8, NsAlgorithm::kNs5, 0.007}, {8, NsAlgorithm::kNs5, 0.007}});
  EXPECT_NEAR(splitter.Seconds(16), 0.014, kTol);
  // Up to 9 the curve is concave enough: nothing splits. (Between 8 and 16
  // each matrix costs 1.125 ms, so 10 to 15 split off a batch of 8.)
  for (int64_t n = 1; n <= 9; ++n) {
    SCOPED_TRACE(n);
    EXPECT_EQ(splitter.Parts(n).size(), 1u);
    EXPECT_NEAR(splitter.Seconds(n),
                model.NsSeconds(1024, 1024, n, NsAlgorithm::kNs5), kTol);
  }
}

TEST(BatchSplitterTest, SixteenFasterThanTwoEightsStaysOneCall) {
  const CostModel model(SixteenAt(0.013), DeviceRates{}, 1.0, 5);
  BatchSplitter splitter(model, 1024, 1024, AlgorithmPolicy::kAuto);
  ExpectParts(splitter.Parts(16), {{16, NsAlgorithm::kNs5, 0.013}});
  EXPECT_NEAR(splitter.Seconds(16), 0.013, kTol);
}

TEST(BatchSplitterTest, SplitsOnlyWhenSavingMoreThanTheMargin) {
  // Two eights take 14 ms: 1.4% below 14.2 ms, 2.8% below 14.4 ms.
  ASSERT_EQ(kSplitMargin, 0.02);
  const CostModel noise(SixteenAt(0.0142), DeviceRates{}, 1.0, 5);
  EXPECT_EQ(
      BatchSplitter(noise, 1024, 1024, AlgorithmPolicy::kAuto).Parts(16).size(),
      1u);
  EXPECT_NEAR(
      BatchSplitter(noise, 1024, 1024, AlgorithmPolicy::kAuto).Seconds(16),
      0.0142, kTol);
  const CostModel real(SixteenAt(0.0144), DeviceRates{}, 1.0, 5);
  BatchSplitter splitter(real, 1024, 1024, AlgorithmPolicy::kAuto);
  EXPECT_EQ(splitter.Parts(16).size(), 2u);
  EXPECT_NEAR(splitter.Seconds(16), 0.014, kTol);
}

TEST(BatchSplitterTest, SpeedAndStepsScaleTheParts) {
  // Twice as fast and 10 steps instead of the table's 5: times unchanged.
  const CostModel model(SixteenAt(0.016), DeviceRates{}, 2.0, 10);
  BatchSplitter splitter(model, 1024, 1024, AlgorithmPolicy::kAuto);
  ExpectParts(splitter.Parts(16),
              {{8, NsAlgorithm::kNs5, 0.007}, {8, NsAlgorithm::kNs5, 0.007}});
}

TEST(BatchSplitterTest, PartsMayMixAlgorithms) {
  // Gram wins one matrix, NS5 a batch of 8; nine run best as 8 NS5 + 1 Gram
  // (4.6 ms) rather than one NS5 call of 9 (5 ms). A policy of NS5 only
  // gains nothing from that split.
  const auto table = SquareTable(
      {{1, 0.0010, 0.0006}, {8, 0.0040, 0.0060}, {16, 0.0120, 0.0125}});
  const CostModel model(table, DeviceRates{}, 1.0, 5);
  BatchSplitter automatic(model, 1024, 1024, AlgorithmPolicy::kAuto);
  ExpectParts(automatic.Parts(9),
              {{8, NsAlgorithm::kNs5, 0.004}, {1, NsAlgorithm::kGram, 0.0006}});
  EXPECT_NEAR(automatic.Seconds(9), 0.0046, kTol);
  BatchSplitter ns5(model, 1024, 1024, AlgorithmPolicy::kNs5);
  ExpectParts(ns5.Parts(9), {{9, NsAlgorithm::kNs5, 0.005}});
}

TEST(BatchSplitterTest, RooflineNeverSplits) {
  const CostModel roofline(nullptr, DeviceRates{}, 1.0, 5);
  // A table measuring another shape leaves this one on the roofline too.
  const CostModel other(SixteenAt(0.030), DeviceRates{}, 1.0, 5);
  for (const CostModel* model : {&roofline, &other}) {
    for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
             {1024, 4096}, {4096, 4096}, {8, 8}, {512, 14336}}) {
      for (const AlgorithmPolicy policy :
           {AlgorithmPolicy::kAuto, AlgorithmPolicy::kNs5,
            AlgorithmPolicy::kGram}) {
        BatchSplitter splitter(*model, rows, cols, policy);
        for (int64_t n = 1; n <= 64; ++n) {
          SCOPED_TRACE(absl::StrCat(rows, "x", cols, " batch ", n));
          const BatchParts parts = splitter.Parts(n);
          ASSERT_EQ(parts.size(), 1u);
          const CostModel::Choice best = model->Best(rows, cols, n, policy);
          EXPECT_EQ(parts[0].count, n);
          EXPECT_EQ(parts[0].algorithm, best.algorithm);
          EXPECT_EQ(parts[0].seconds, best.seconds);
          EXPECT_EQ(splitter.Seconds(n), best.seconds);
        }
      }
    }
  }
}

TEST(BatchSplitterTest, EmptyBatchHasNoPartsAndCostsNothing) {
  const CostModel model(SixteenAt(0.016), DeviceRates{}, 1.0, 5);
  BatchSplitter splitter(model, 1024, 1024, AlgorithmPolicy::kAuto);
  EXPECT_TRUE(splitter.Parts(0).empty());
  EXPECT_EQ(splitter.Seconds(0), 0);
  EXPECT_EQ(splitter.Seconds(-3), 0);
}

// Drawing first parts from measured sizes only loses nothing: against every
// way to write n as a sum (exhaustive), on noisy tables that are neither
// concave nor convex.
TEST(BatchSplitterTest, MatchesExhaustiveSplittingOnRandomTables) {
  std::mt19937 rng(20261130);
  std::uniform_real_distribution<double> jitter(0.6, 1.4);
  for (int trial = 0; trial < 40; ++trial) {
    SCOPED_TRACE(trial);
    // Each algorithm measured at its own sizes (1 always, others by chance).
    auto table = std::make_shared<CostTable>();
    for (const NsAlgorithm algorithm :
         {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
      for (const int64_t batch : {1, 3, 4, 8, 12, 16}) {
        if (batch > 1 && rng() % 3 == 0) continue;
        ASSERT_TRUE(
            table->Add(1024, 1024, algorithm, batch, 1e-3 * batch * jitter(rng))
                .ok());
      }
    }
    const CostModel model(table, DeviceRates{}, 1.0, 5);
    BatchSplitter splitter(model, 1024, 1024, AlgorithmPolicy::kAuto);
    std::vector<double> whole = {0}, optimum = {0};
    for (int64_t n = 1; n <= 40; ++n) {
      whole.push_back(
          model.Best(1024, 1024, n, AlgorithmPolicy::kAuto).seconds);
      double best = whole[n];
      for (int64_t a = 1; a < n; ++a) {
        best = std::min(best, whole[a] + optimum[n - a]);
      }
      optimum.push_back(best);
      const double want =
          best < whole[n] * (1 - kSplitMargin) ? best : whole[n];
      EXPECT_NEAR(splitter.Seconds(n), want, 1e-9 * want) << "batch " << n;
      double sum = 0;
      int64_t count = 0;
      for (const BatchPart& part : splitter.Parts(n)) {
        sum += part.seconds;
        count += part.count;
      }
      EXPECT_EQ(count, n);
      EXPECT_NEAR(sum, splitter.Seconds(n), 1e-9 * want);
    }
  }
}

PlanInput SixteenOnOneWorker(std::shared_ptr<const CostTable> table) {
  PlanInput input;
  for (int i = 0; i < 16; ++i) {
    MatrixSpec m;
    m.name = absl::StrCat("layers.", i, ".attn.o");
    m.rows = 1024;
    m.cols = 1024;
    input.matrices.push_back(m);
  }
  WorkerSpec w;
  w.id = "w0";
  w.costs = std::move(table);
  input.workers.push_back(w);
  return input;
}

TEST(PlannerSplitTest, PlanSplitsTheBatchTheTableMakesSlowerWhole) {
  const PlanInput input = SixteenOnOneWorker(SixteenAt(0.016));
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->batches.size(), 1u);
  const Batch& batch = plan->batches[0];
  EXPECT_EQ(batch.items.size(), 16u);
  ExpectParts(batch.parts,
              {{8, NsAlgorithm::kNs5, 0.007}, {8, NsAlgorithm::kNs5, 0.007}});
  EXPECT_NEAR(batch.seconds, 0.014, kTol);
  // The worker's prediction adds the split's time (the link carries
  // nothing for replicated matrices on a worker with a trainer, but the
  // update goes back).
  const CostModel model(input.workers[0].costs, input.workers[0].rates, 1.0, 5);
  EXPECT_NEAR(plan->worker_seconds[0],
              0.014 + model.TransferSeconds(16.0 * 1024 * 1024 * 4), kTol);
}

TEST(PlannerSplitTest, PlanKeepsOneCallWhereTheWholeBatchIsFaster) {
  const absl::StatusOr<OwnershipPlan> plan =
      PlanOwnership(SixteenOnOneWorker(SixteenAt(0.013)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->batches.size(), 1u);
  ExpectParts(plan->batches[0].parts, {{16, NsAlgorithm::kNs5, 0.013}});
  EXPECT_NEAR(plan->batches[0].seconds, 0.013, kTol);
}

TEST(PlannerSplitTest, PlansWithoutATableHaveOnePartPerBatch) {
  PlanInput input;
  for (int i = 0; i < 40; ++i) {
    MatrixSpec m;
    m.name = absl::StrCat("m", i);
    m.rows = 256 << (i % 4);
    m.cols = 1024;
    m.experts = 1 + i % 3;
    input.matrices.push_back(m);
  }
  for (int w = 0; w < 3; ++w) {
    WorkerSpec worker;
    worker.id = absl::StrCat("w", w);
    worker.speed = 1.0 + w;
    input.workers.push_back(worker);
  }
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_FALSE(plan->batches.empty());
  for (const Batch& b : plan->batches) {
    const WorkerSpec& w = input.workers[b.worker];
    const CostModel model(nullptr, w.rates, w.speed, 5);
    const CostModel::Choice best =
        model.Best(b.rows, b.cols, static_cast<int64_t>(b.items.size()),
                   AlgorithmPolicy::kAuto);
    ASSERT_EQ(b.parts.size(), 1u);
    EXPECT_EQ(b.parts[0].count, static_cast<int64_t>(b.items.size()));
    EXPECT_EQ(b.parts[0].algorithm, best.algorithm);
    EXPECT_EQ(b.parts[0].seconds, best.seconds);
    EXPECT_EQ(b.seconds, best.seconds);
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
