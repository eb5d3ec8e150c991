// The plan's batches through the one proto <-> C++ translation: parts
// survive the round trip, a batch from before parts reads as one part, and
// members or workers the job lacks are named; a worker's step report becomes
// the last step ListWorkers shows, every figure kept.
#include "proto/translate.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace proto {
namespace {

using kernels::NsAlgorithm;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<scheduler::MatrixSpec> Matrices() {
  scheduler::MatrixSpec a;
  a.name = "a";
  a.rows = 64;
  a.cols = 128;
  scheduler::MatrixSpec moe;
  moe.name = "moe";
  moe.rows = 32;
  moe.cols = 64;
  moe.experts = 3;
  return {a, moe};
}

// "a" on w0; the three experts of "moe" on w1.
v1::Plan PlacedPlan() {
  v1::Plan plan;
  plan.add_workers("w0");
  plan.add_workers("w1");
  v1::MatrixPlacement* a = plan.add_matrices();
  a->set_name("a");
  a->add_owners("w0");
  v1::MatrixPlacement* moe = plan.add_matrices();
  moe->set_name("moe");
  for (int e = 0; e < 3; ++e) moe->add_owners("w1");
  return plan;
}

scheduler::Batch SplitMoeBatch() {
  scheduler::Batch batch;
  batch.worker = 1;
  batch.rows = 32;
  batch.cols = 64;
  batch.items = {{1, 0}, {1, 1}, {1, 2}};
  batch.parts = {{2, NsAlgorithm::kGram, 0.002},
                 {1, NsAlgorithm::kNs5, 0.0015}};
  batch.seconds = 0.0035;
  return batch;
}

TEST(TranslateBatchTest, PartsSurviveTheRoundTrip) {
  const std::vector<scheduler::MatrixSpec> matrices = Matrices();
  const scheduler::Batch batch = SplitMoeBatch();
  v1::Plan plan = PlacedPlan();
  *plan.add_batches() = BatchToProto(batch, {"w0", "w1"}, matrices);

  const v1::Batch& proto = plan.batches(0);
  EXPECT_EQ(proto.worker_id(), "w1");
  EXPECT_EQ(proto.algorithm(), v1::NS_ALGORITHM_GRAM);  // the first part's
  EXPECT_THAT(proto.matrices(), ElementsAre("moe[0]", "moe[1]", "moe[2]"));
  EXPECT_EQ(proto.predicted_seconds(), 0.0035);
  ASSERT_EQ(proto.parts_size(), 2);
  EXPECT_EQ(proto.parts(1).count(), 1);
  EXPECT_EQ(proto.parts(1).algorithm(), v1::NS_ALGORITHM_NS5);
  EXPECT_EQ(proto.parts(1).predicted_seconds(), 0.0015);

  const absl::StatusOr<scheduler::OwnershipPlan> back =
      OwnershipFromPlan(plan, matrices);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->batches.size(), 1u);
  const scheduler::Batch& got = back->batches[0];
  EXPECT_EQ(got.worker, batch.worker);
  EXPECT_EQ(got.rows, batch.rows);
  EXPECT_EQ(got.cols, batch.cols);
  EXPECT_EQ(got.seconds, batch.seconds);
  ASSERT_EQ(got.items.size(), batch.items.size());
  for (size_t i = 0; i < got.items.size(); ++i) {
    EXPECT_EQ(got.items[i].matrix, batch.items[i].matrix);
    EXPECT_EQ(got.items[i].expert, batch.items[i].expert);
  }
  ASSERT_EQ(got.parts.size(), batch.parts.size());
  for (size_t p = 0; p < got.parts.size(); ++p) {
    EXPECT_EQ(got.parts[p].count, batch.parts[p].count);
    EXPECT_EQ(got.parts[p].algorithm, batch.parts[p].algorithm);
    EXPECT_EQ(got.parts[p].seconds, batch.parts[p].seconds);
  }
}

TEST(TranslateBatchTest, BatchWithoutPartsIsOneCallOfItsAlgorithm) {
  v1::Plan plan = PlacedPlan();
  v1::Batch* batch = plan.add_batches();
  batch->set_worker_id("w0");
  batch->set_rows(64);
  batch->set_cols(128);
  batch->set_algorithm(v1::NS_ALGORITHM_GRAM);
  batch->add_matrices("a");
  batch->set_predicted_seconds(0.25);
  const absl::StatusOr<scheduler::OwnershipPlan> got =
      OwnershipFromPlan(plan, Matrices());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->batches.size(), 1u);
  ASSERT_EQ(got->batches[0].parts.size(), 1u);
  EXPECT_EQ(got->batches[0].parts[0].count, 1);
  EXPECT_EQ(got->batches[0].parts[0].algorithm, NsAlgorithm::kGram);
  EXPECT_EQ(got->batches[0].parts[0].seconds, 0.25);
}

TEST(TranslateBatchTest, MembersAndWorkersTheJobLacksAreNamed) {
  for (const std::string& member :
       {std::string("nope"), std::string("moe"), std::string("moe[3]"),
        std::string("moe[-1]"), std::string("moe[x]"), std::string("a[0]")}) {
    SCOPED_TRACE(member);
    v1::Plan plan = PlacedPlan();
    v1::Batch* batch = plan.add_batches();
    batch->set_worker_id("w1");
    batch->add_matrices("moe[0]");
    batch->add_matrices(member);
    const absl::Status status = OwnershipFromPlan(plan, Matrices()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("plan.batches[0].matrices[1]"));
  }
  v1::Plan plan = PlacedPlan();
  plan.add_batches()->set_worker_id("w9");
  const absl::Status status = OwnershipFromPlan(plan, Matrices()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("plan.batches[0].worker_id: \"w9\""));
}

TEST(TranslateStepStatsTest, ReportBecomesLastStepWithEveryFigure) {
  v1::ReportStepStatsRequest report;
  report.set_job("j");
  report.set_worker_id("w0");
  report.set_worker_token("secret");
  report.set_step(12);
  report.set_plan_version(3);
  report.set_step_seconds(0.075);
  report.set_ns_seconds(0.041);
  report.set_predicted_ns_seconds(0.0375);
  report.set_bytes_moved(int64_t{7} << 30);
  const v1::WorkerStepStats stats = WorkerStepStatsFromReport(report);
  EXPECT_EQ(stats.step(), 12);
  EXPECT_EQ(stats.plan_version(), 3);
  EXPECT_EQ(stats.step_seconds(), 0.075);
  EXPECT_EQ(stats.ns_seconds(), 0.041);
  EXPECT_EQ(stats.predicted_ns_seconds(), 0.0375);
  EXPECT_EQ(stats.bytes_moved(), int64_t{7} << 30);
  // Every field of WorkerStepStats is set from the report (a new one added
  // to the message without a line above fails here).
  EXPECT_EQ(stats.GetDescriptor()->field_count(), 6);
}

}  // namespace
}  // namespace proto
}  // namespace muonps
