#include "scheduler/cost_model.h"

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "newton_schulz/flops.h"

namespace muonps {
namespace scheduler {
namespace {

// Seconds compared to a picosecond: far below any measured time, far above
// double rounding of millisecond values.
constexpr double kTol = 1e-12;

// Rates chosen for the test rather than the header's defaults, so the
// expected numbers below do not drift when the defaults are retuned.
DeviceRates TestRates() {
  DeviceRates rates;
  rates.flops_per_second = 500e12;
  rates.memory_bytes_per_second = 4e12;
  rates.call_overhead_seconds = 50e-6;
  rates.link_bytes_per_second = 100e9;
  return rates;
}

std::shared_ptr<const CostTable> TableOf(
    const std::vector<
        std::tuple<int64_t, int64_t, NsAlgorithm, int64_t, double>>& points) {
  auto table = std::make_shared<CostTable>();
  for (const auto& [rows, cols, algorithm, batch, seconds] : points) {
    const absl::Status status =
        table->Add(rows, cols, algorithm, batch, seconds);
    EXPECT_TRUE(status.ok()) << status;
  }
  return table;
}

// 1024 x 4096 gram: 2 ms at batch 1, 9 ms at batch 8, 13 ms at batch 16.
// 512 x 512 ns5: 8 ms at batch 4, 12 ms at batch 8.
// 256 x 2048 ns5: a single point, 8 ms at batch 4.
std::shared_ptr<const CostTable> CurvesTable() {
  return TableOf({{1024, 4096, NsAlgorithm::kGram, 1, 0.002},
                  {1024, 4096, NsAlgorithm::kGram, 8, 0.009},
                  {1024, 4096, NsAlgorithm::kGram, 16, 0.013},
                  {512, 512, NsAlgorithm::kNs5, 4, 0.008},
                  {512, 512, NsAlgorithm::kNs5, 8, 0.012},
                  {256, 2048, NsAlgorithm::kNs5, 4, 0.008}});
}

TEST(CostModelTableTest, MeasuredBatchesGiveTheMeasuredTimes) {
  const CostModel model(CurvesTable(), TestRates(), 1.0, 5);
  EXPECT_NEAR(model.NsSeconds(1024, 4096, 1, NsAlgorithm::kGram), 0.002, kTol);
  EXPECT_NEAR(model.NsSeconds(1024, 4096, 8, NsAlgorithm::kGram), 0.009, kTol);
  EXPECT_NEAR(model.NsSeconds(4096, 1024, 16, NsAlgorithm::kGram), 0.013, kTol);
  EXPECT_NEAR(model.NsSeconds(512, 512, 4, NsAlgorithm::kNs5), 0.008, kTol);
}

TEST(CostModelTableTest, BetweenMeasuredBatchesInterpolatesLinearly) {
  const CostModel model(CurvesTable(), TestRates(), 1.0, 5);
  // 2 ms + (9 - 2) ms * (4 - 1) / (8 - 1) = 5 ms.
  EXPECT_NEAR(model.NsSeconds(1024, 4096, 4, NsAlgorithm::kGram), 0.005, kTol);
  EXPECT_NEAR(model.NsSeconds(1024, 4096, 2, NsAlgorithm::kGram), 0.003, kTol);
  // Second segment: 9 ms + 0.5 ms per batch.
  EXPECT_NEAR(model.NsSeconds(1024, 4096, 12, NsAlgorithm::kGram), 0.011, kTol);
  EXPECT_NEAR(model.NsSeconds(512, 512, 6, NsAlgorithm::kNs5), 0.010, kTol);
}

TEST(CostModelTableTest, PastTheLastBatchExtendsTheLastSegmentSlope) {
  const CostModel model(CurvesTable(), TestRates(), 1.0, 5);
  // Last segment (8, 9 ms) - (16, 13 ms): 0.5 ms per matrix.
  EXPECT_NEAR(model.NsSeconds(1024, 4096, 20, NsAlgorithm::kGram), 0.015, kTol);
  EXPECT_NEAR(model.NsSeconds(1024, 4096, 32, NsAlgorithm::kGram), 0.021, kTol);
  // (4, 8 ms) - (8, 12 ms): 1 ms per matrix.
  EXPECT_NEAR(model.NsSeconds(512, 512, 10, NsAlgorithm::kNs5), 0.014, kTol);
}

TEST(CostModelTableTest, FallingLastSegmentNeverExtrapolatesBelowItsEnd) {
  // Noise made batch 2 faster than batch 1: past it, time stays flat rather
  // than falling towards negative values.
  const CostModel model(TableOf({{64, 64, NsAlgorithm::kNs5, 1, 50e-6},
                                 {64, 64, NsAlgorithm::kNs5, 2, 45e-6}}),
                        TestRates(), 1.0, 5);
  for (const int64_t batch : {3, 12, 64, 4096}) {
    EXPECT_NEAR(model.NsSeconds(64, 64, batch, NsAlgorithm::kNs5), 45e-6, kTol)
        << batch;
  }
  EXPECT_GT(model.Best(64, 64, 64, AlgorithmPolicy::kNs5).seconds, 0);
}

TEST(CostModelTableTest, BelowTheFirstBatchScalesInProportion) {
  const CostModel model(CurvesTable(), TestRates(), 1.0, 5);
  // 8 ms at batch 4: 2 ms per matrix below it (not the 1 ms/matrix slope).
  EXPECT_NEAR(model.NsSeconds(512, 512, 2, NsAlgorithm::kNs5), 0.004, kTol);
  EXPECT_NEAR(model.NsSeconds(512, 512, 1, NsAlgorithm::kNs5), 0.002, kTol);
  EXPECT_NEAR(model.NsSeconds(512, 512, 3, NsAlgorithm::kNs5), 0.006, kTol);
}

TEST(CostModelTableTest, SinglePointCurveIsProportionalOnBothSides) {
  const CostModel model(CurvesTable(), TestRates(), 1.0, 5);
  EXPECT_NEAR(model.NsSeconds(256, 2048, 1, NsAlgorithm::kNs5), 0.002, kTol);
  EXPECT_NEAR(model.NsSeconds(2048, 256, 4, NsAlgorithm::kNs5), 0.008, kTol);
  EXPECT_NEAR(model.NsSeconds(256, 2048, 8, NsAlgorithm::kNs5), 0.016, kTol);
  EXPECT_NEAR(model.NsSeconds(256, 2048, 100, NsAlgorithm::kNs5), 0.2, kTol);
}

TEST(CostModelTest, SpeedFactorDividesTableAndFallbackTimes) {
  const auto table = CurvesTable();
  const CostModel base(table, TestRates(), 1.0, 5);
  const CostModel fast(table, TestRates(), 2.0, 5);
  const CostModel slow(table, TestRates(), 0.5, 5);
  // Table shape.
  EXPECT_NEAR(fast.NsSeconds(1024, 4096, 4, NsAlgorithm::kGram), 0.0025, kTol);
  EXPECT_NEAR(slow.NsSeconds(1024, 4096, 4, NsAlgorithm::kGram), 0.010, kTol);
  // Fallback shape, overhead included.
  const double fallback = base.NsSeconds(3000, 5000, 3, NsAlgorithm::kNs5);
  ASSERT_GT(fallback, 0);
  EXPECT_DOUBLE_EQ(fast.NsSeconds(3000, 5000, 3, NsAlgorithm::kNs5),
                   fallback / 2);
  EXPECT_DOUBLE_EQ(slow.NsSeconds(3000, 5000, 3, NsAlgorithm::kNs5),
                   fallback * 2);
  EXPECT_EQ(fast.speed(), 2.0);
}

TEST(CostModelTest, NsStepsScaleTableTimesByStepsOverFive) {
  const auto table = CurvesTable();
  const CostModel ten(table, TestRates(), 1.0, 10);
  const CostModel three(table, TestRates(), 1.0, 3);
  EXPECT_NEAR(ten.NsSeconds(1024, 4096, 4, NsAlgorithm::kGram), 0.010, kTol);
  EXPECT_NEAR(three.NsSeconds(1024, 4096, 4, NsAlgorithm::kGram), 0.003, kTol);
  EXPECT_NEAR(ten.NsSeconds(512, 512, 8, NsAlgorithm::kNs5), 0.024, kTol);
}

TEST(CostModelFallbackTest, ComputeBoundShapeFollowsTheExecutedFlops) {
  const DeviceRates rates = TestRates();
  // Shapes missing from the table fall back, as they do with no table.
  const CostModel with_table(CurvesTable(), rates, 1.0, 5);
  const CostModel without(nullptr, rates, 1.0, 5);

  // One-triangle NS5 on a square m x m matrix, per step: X X^T (m^3 of a
  // triangle), A^2 (m^3), B X dense (2 m^3): 4 m^3; 5 steps.
  const double m = 4096;
  const double flops = 5 * 4 * m * m * m;
  ASSERT_DOUBLE_EQ(NsExecutedFlops(4096, 4096, {}), flops);
  // bf16 bytes are a few m^2 per step: far below the FLOP time here.
  const double compute_seconds = flops / rates.flops_per_second;
  ASSERT_GT(compute_seconds,
            5 * (5 * 2 * 7 * m * m) / rates.memory_bytes_per_second);

  const double expected = rates.call_overhead_seconds + 3 * compute_seconds;
  EXPECT_DOUBLE_EQ(without.NsSeconds(4096, 4096, 3, NsAlgorithm::kNs5),
                   expected);
  EXPECT_DOUBLE_EQ(with_table.NsSeconds(4096, 4096, 3, NsAlgorithm::kNs5),
                   expected);
  // ~2.8 ms a matrix at 500 TFLOP/s: a plausible H200 figure.
  EXPECT_NEAR(expected, 50e-6 + 3 * 2.749e-3, 1e-5);
}

TEST(CostModelFallbackTest, GramFallbackFollowsTheGramFlopCount) {
  const DeviceRates rates = TestRates();
  const CostModel model(nullptr, rates, 1.0, 5);
  NewtonSchulzOptions gram;
  gram.algorithm = NsAlgorithm::kGram;
  const double flops = NsExecutedFlops(4096, 4096, gram);
  EXPECT_DOUBLE_EQ(
      model.NsSeconds(4096, 4096, 2, NsAlgorithm::kGram),
      rates.call_overhead_seconds + 2 * flops / rates.flops_per_second);
}

TEST(CostModelFallbackTest, MemoryBoundShapeIsLinearInBatchAndMemoryRate) {
  DeviceRates rates = TestRates();
  rates.flops_per_second = 1e30;  // FLOPs cost nothing: bytes decide
  const CostModel model(nullptr, rates, 1.0, 5);
  rates.memory_bytes_per_second *= 2;
  const CostModel faster_memory(nullptr, rates, 1.0, 5);
  const double overhead = rates.call_overhead_seconds;
  const double one = model.NsSeconds(64, 65536, 1, NsAlgorithm::kNs5);
  const double four = model.NsSeconds(64, 65536, 4, NsAlgorithm::kNs5);
  ASSERT_GT(one - overhead, 1e-9);
  EXPECT_NEAR(four - overhead, 4 * (one - overhead), kTol);
  EXPECT_NEAR(
      faster_memory.NsSeconds(64, 65536, 1, NsAlgorithm::kNs5) - overhead,
      (one - overhead) / 2, kTol);
}

TEST(CostModelFallbackTest, BatchingPaysTheCallOverheadOnce) {
  const DeviceRates rates = TestRates();
  const CostModel model(nullptr, rates, 1.0, 5);
  for (const NsAlgorithm algorithm : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    SCOPED_TRACE(NsAlgorithmName(algorithm));
    const double t1 = model.NsSeconds(512, 2048, 1, algorithm);
    const double t2 = model.NsSeconds(512, 2048, 2, algorithm);
    EXPECT_LT(t2, 2 * t1);
    EXPECT_NEAR(2 * t1 - t2, rates.call_overhead_seconds, kTol);
  }
}

TEST(CostModelBestTest, AutoPicksGramForWideMatricesWithoutMeasurements) {
  const CostModel model(nullptr, TestRates(), 1.0, 5);
  const CostModel::Choice choice =
      model.Best(1024, 8192, 4, AlgorithmPolicy::kAuto);
  EXPECT_EQ(choice.algorithm, NsAlgorithm::kGram);
  EXPECT_DOUBLE_EQ(choice.seconds,
                   model.NsSeconds(1024, 8192, 4, NsAlgorithm::kGram));
  EXPECT_LT(choice.seconds, model.NsSeconds(1024, 8192, 4, NsAlgorithm::kNs5));
}

TEST(CostModelBestTest, AutoPicksNs5ForSquareMatricesWithoutMeasurements) {
  const CostModel model(nullptr, TestRates(), 1.0, 5);
  const CostModel::Choice choice =
      model.Best(4096, 4096, 3, AlgorithmPolicy::kAuto);
  EXPECT_EQ(choice.algorithm, NsAlgorithm::kNs5);
  EXPECT_DOUBLE_EQ(choice.seconds,
                   model.NsSeconds(4096, 4096, 3, NsAlgorithm::kNs5));
  EXPECT_LE(choice.seconds, model.NsSeconds(4096, 4096, 3, NsAlgorithm::kGram));
}

TEST(CostModelBestTest, AutoFollowsTheTableWhereItMeasuredBoth) {
  // Measured: NS5 beats Gram on a wide shape where the roofline says Gram.
  const auto table = TableOf({{2048, 8192, NsAlgorithm::kNs5, 1, 0.001},
                              {2048, 8192, NsAlgorithm::kNs5, 8, 0.006},
                              {2048, 8192, NsAlgorithm::kGram, 1, 0.003},
                              {2048, 8192, NsAlgorithm::kGram, 8, 0.018}});
  const CostModel roofline(nullptr, TestRates(), 1.0, 5);
  ASSERT_EQ(roofline.Best(2048, 8192, 4, AlgorithmPolicy::kAuto).algorithm,
            NsAlgorithm::kGram);

  const CostModel measured(table, TestRates(), 1.0, 5);
  for (const int64_t batch : {1, 4, 8, 20}) {
    SCOPED_TRACE(batch);
    const CostModel::Choice choice =
        measured.Best(8192, 2048, batch, AlgorithmPolicy::kAuto);
    EXPECT_EQ(choice.algorithm, NsAlgorithm::kNs5);
    EXPECT_DOUBLE_EQ(choice.seconds,
                     measured.NsSeconds(2048, 8192, batch, NsAlgorithm::kNs5));
  }
  EXPECT_NEAR(measured.Best(2048, 8192, 8, AlgorithmPolicy::kAuto).seconds,
              0.006, kTol);
}

TEST(CostModelBestTest, FixedPoliciesForceTheirAlgorithm) {
  const CostModel model(nullptr, TestRates(), 1.0, 5);
  // NS5 where Gram would win, and Gram where NS5 would.
  const CostModel::Choice ns5 =
      model.Best(1024, 8192, 4, AlgorithmPolicy::kNs5);
  EXPECT_EQ(ns5.algorithm, NsAlgorithm::kNs5);
  EXPECT_DOUBLE_EQ(ns5.seconds,
                   model.NsSeconds(1024, 8192, 4, NsAlgorithm::kNs5));
  const CostModel::Choice gram =
      model.Best(4096, 4096, 3, AlgorithmPolicy::kGram);
  EXPECT_EQ(gram.algorithm, NsAlgorithm::kGram);
  EXPECT_DOUBLE_EQ(gram.seconds,
                   model.NsSeconds(4096, 4096, 3, NsAlgorithm::kGram));
}

TEST(CostModelTest, TransferSecondsIsBytesOverLinkRate) {
  const CostModel model(nullptr, TestRates(), 1.0, 5);
  EXPECT_DOUBLE_EQ(model.TransferSeconds(1e9), 0.01);
  EXPECT_DOUBLE_EQ(model.TransferSeconds(0), 0);
  // The speed factor is about compute; the link does not change with it.
  const CostModel fast(nullptr, TestRates(), 4.0, 5);
  EXPECT_DOUBLE_EQ(fast.TransferSeconds(3e8), 3e8 / 100e9);
}

TEST(CostModelTest, NonPositiveBatchCostsNothing) {
  const CostModel model(CurvesTable(), TestRates(), 1.0, 5);
  for (const int64_t batch : {0, -1, -100}) {
    SCOPED_TRACE(batch);
    EXPECT_EQ(model.NsSeconds(1024, 4096, batch, NsAlgorithm::kGram), 0);
    EXPECT_EQ(model.NsSeconds(4096, 4096, batch, NsAlgorithm::kNs5), 0);
    EXPECT_EQ(model.NsSeconds(4096, 4096, batch, NsAlgorithm::kGram), 0);
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
