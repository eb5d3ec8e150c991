// The plan's batches through the one proto <-> C++ translation: parts
// survive the round trip, a batch from before parts reads as one part, and
// members or workers the job lacks are named; owner groups read as ranks;
// a declared matrix gets the API's defaults and a value outside an enum is
// refused naming its field.
#include "proto/translate.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace proto {
namespace {

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

TEST(TranslateOwnerGroupsTest, GroupsReadAsRanksAndAnUnknownWorkerIsNamed) {
  v1::Plan plan = PlacedPlan();
  plan.add_workers("w2");
  plan.add_workers("w3");
  v1::OwnerGroup* first = plan.add_owner_groups();
  first->add_workers("w0");
  first->add_workers("w1");
  v1::OwnerGroup* second = plan.add_owner_groups();
  second->add_workers("w3");
  second->add_workers("w2");
  absl::StatusOr<scheduler::OwnershipPlan> got =
      OwnershipFromPlan(plan, Matrices());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->groups, ElementsAre(ElementsAre(0, 1), ElementsAre(3, 2)));
  EXPECT_TRUE(OwnershipFromPlan(PlacedPlan(), Matrices())->groups.empty());
  plan.mutable_owner_groups(1)->set_workers(1, "w9");
  const absl::Status status = OwnershipFromPlan(plan, Matrices()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("plan.owner_groups[1].workers[1]: \"w9\""));
}

TEST(TranslateExchangeNodesTest, NodesReadAsRanksAndAnUnknownWorkerIsNamed) {
  v1::Plan plan = PlacedPlan();
  plan.add_workers("w2");
  plan.add_workers("w3");
  for (const auto& workers : {std::vector<std::string>{"w0", "w2"},
                              std::vector<std::string>{"w1", "w3"}}) {
    v1::NodeWorkers* node = plan.add_exchange_nodes();
    for (const std::string& w : workers) node->add_workers(w);
  }
  absl::StatusOr<scheduler::OwnershipPlan> got =
      OwnershipFromPlan(plan, Matrices());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->exchange_nodes,
              ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3)));
  EXPECT_TRUE(
      OwnershipFromPlan(PlacedPlan(), Matrices())->exchange_nodes.empty());
  plan.mutable_exchange_nodes(0)->set_workers(1, "w9");
  const absl::Status status = OwnershipFromPlan(plan, Matrices()).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("plan.exchange_nodes[0].workers[1]: \"w9\""));
}

TEST(TranslateMatrixTest, FillsTheApiDefaultsAndKeepsEveryOtherValue) {
  v1::Matrix bare;
  bare.set_name("w");
  bare.set_rows(8);
  bare.set_cols(16);
  bare.set_layer(3);
  absl::StatusOr<scheduler::MatrixSpec> m = MatrixFromProto(bare, "m");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "w");
  EXPECT_EQ(m->rows, 8);
  EXPECT_EQ(m->cols, 16);
  EXPECT_EQ(m->layer, 3);
  EXPECT_EQ(m->experts, 1);
  EXPECT_EQ(m->dtype, DType::kFloat32);
  EXPECT_EQ(m->layout, scheduler::Layout::kReplicated);
  // A negative expert count is left for the range check to name.
  bare.set_experts(-2);
  EXPECT_EQ(MatrixFromProto(bare, "m")->experts, -2);
  // Every field set survives the way back.
  scheduler::MatrixSpec full = *m;
  full.experts = 4;
  full.dtype = DType::kBFloat16;
  full.layout = scheduler::Layout::kRowSharded;
  absl::StatusOr<scheduler::MatrixSpec> again =
      MatrixFromProto(MatrixToProto(full), "m");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->experts, 4);
  EXPECT_EQ(again->dtype, DType::kBFloat16);
  EXPECT_EQ(again->layout, scheduler::Layout::kRowSharded);
  EXPECT_EQ(MatricesFromJob(v1::JobSpec()).size(), 0u);
}

TEST(TranslateMatrixTest, ValuesOutsideTheEnumsNameTheirField) {
  v1::Matrix m;
  m.set_dtype(static_cast<v1::DType>(9));
  absl::Status status = MatrixFromProto(m, "job.matrices[2]").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("job.matrices[2].dtype: unknown dtype 9"));
  m.set_dtype(v1::DTYPE_FP16);
  m.set_layout(static_cast<v1::Layout>(42));
  status = MatrixFromProto(m, "job.matrices[2]").status();
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("job.matrices[2].layout: unknown layout 42"));
}

}  // namespace
}  // namespace proto
}  // namespace muonps
