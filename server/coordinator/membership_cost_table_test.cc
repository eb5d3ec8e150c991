// Cost tables workers join with (Membership::JoinJob): parsed into
// the plan's predictions and splits, refused with the line when malformed,
// and refused when measured on another GPU model than the worker's.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_fixture.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::Join;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST_F(CoordinatorTest, JoinParsesCostTableIntoPlanPredictions) {
  v1::JobSpec spec = Spec("x", 1, 64, 64);
  spec.mutable_muon()->set_ns_algorithm(v1::NS_ALGORITHM_NS5);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  join.set_cost_table(
      "# measured\n"
      "{\"device\": \"NVIDIA H200\"}\n"
      "{\"rows\": 64, \"cols\": 64, \"algorithm\": \"ns5\", \"batch\": 1, "
      "\"seconds\": 7.5}\n");
  join.set_speed(2.0);
  ASSERT_TRUE(state_->JoinJob(join).ok());
  const v1::Plan plan = CurrentPlan("x");
  ASSERT_EQ(plan.batches_size(), 1);
  // 7.5 s measured, at twice the table's speed.
  EXPECT_NEAR(plan.batches(0).predicted_seconds(), 3.75, 1e-9);
  EXPECT_EQ(plan.batches(0).algorithm(), v1::NS_ALGORITHM_NS5);
  // One matrix: one part, the whole batch.
  ASSERT_EQ(plan.batches(0).parts_size(), 1);
  EXPECT_EQ(plan.batches(0).parts(0).count(), 1);
  EXPECT_NEAR(plan.batches(0).parts(0).predicted_seconds(), 3.75, 1e-9);
}

// A table where four matrices take longer in one call than in two calls of
// two: the published batch carries the split, each part with its time.
TEST_F(CoordinatorTest, CostTableThatFavoursASplitPublishesTheParts) {
  v1::JobSpec spec = Spec("x", 4, 64, 64);
  spec.mutable_muon()->set_ns_algorithm(v1::NS_ALGORITHM_NS5);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  std::string table;
  for (const auto& [batch, seconds] :
       std::vector<std::pair<int, double>>{{1, 1.0}, {2, 1.9}, {4, 4.0}}) {
    absl::StrAppend(&table, "{\"rows\": 64, \"cols\": 64, \"algorithm\": ",
                    "\"ns5\", \"batch\": ", batch, ", \"seconds\": ", seconds,
                    "}\n");
  }
  join.set_cost_table(table);
  ASSERT_TRUE(state_->JoinJob(join).ok());
  const v1::Plan plan = CurrentPlan("x");
  ASSERT_EQ(plan.batches_size(), 1);
  const v1::Batch& batch = plan.batches(0);
  EXPECT_EQ(batch.matrices_size(), 4);
  EXPECT_NEAR(batch.predicted_seconds(), 3.8, 1e-9);
  EXPECT_EQ(batch.algorithm(), v1::NS_ALGORITHM_NS5);
  ASSERT_EQ(batch.parts_size(), 2);
  for (const v1::BatchPart& part : batch.parts()) {
    EXPECT_EQ(part.count(), 2);
    EXPECT_EQ(part.algorithm(), v1::NS_ALGORITHM_NS5);
    EXPECT_NEAR(part.predicted_seconds(), 1.9, 1e-9);
  }
}

TEST_F(CoordinatorTest, MalformedCostTableIsInvalidArgumentNamingLine) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 1))).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  join.set_cost_table("# header\nnot json\n");
  const absl::Status status = state_->JoinJob(join).status();
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kInvalidArgument, "cost_table"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("line 2"));
  EXPECT_THAT(state_->GetJob("x")->workers(), IsEmpty());
  EXPECT_EQ(state_->Counts().workers, 0);
}

TEST_F(CoordinatorTest, CostTableOfAnotherGpuModelIsRefusedNamingBoth) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 1, 64, 64))).ok());
  const std::string table =
      "{\"device\": \"NVIDIA H100 80GB HBM3\"}\n"
      "{\"rows\": 64, \"cols\": 64, \"algorithm\": \"ns5\", \"batch\": 1, "
      "\"seconds\": 0.001}\n";
  v1::JoinJobRequest join = Join("x", "w1");
  join.mutable_device()->set_name("NVIDIA H200");
  join.set_cost_table(table);
  const absl::Status status = state_->JoinJob(join).status();
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kInvalidArgument, "cost_table"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("\"NVIDIA H100 80GB HBM3\""));
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"NVIDIA H200\""));
  EXPECT_EQ(state_->Counts().workers, 0);
  // The same table from the same model joins; so does a worker that names
  // no model (a CPU worker, whose table names its CPU).
  join.mutable_device()->set_name("NVIDIA H100 80GB HBM3");
  EXPECT_TRUE(state_->JoinJob(join).ok());
  v1::JoinJobRequest cpu = Join("x", "w2");
  cpu.mutable_device()->set_kind("cpu");
  cpu.set_cost_table(table);
  EXPECT_TRUE(state_->JoinJob(cpu).ok());
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
