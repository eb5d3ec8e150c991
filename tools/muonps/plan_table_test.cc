// The CLI's renderings. `muonps workers`: the table shows each worker's last
// reported step beside the plan's prediction and the cost model's error
// ("-" where there is none) and each worker's node, and explains one far
// off, and --json carries last_step's fields. `muonps plan` counts tensors
// and their matrices, the nodes, the bucket bound and the owner groups.
#include "tools/muonps/plan_table.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// w0 reported step 42 (41.25 ms of compute against 37.5 predicted) and
// runs at a measured 0.87 of its cost table; w1 reported nothing, from a
// coordinator that shows no speed.
v1::ListWorkersResponse TwoWorkers() {
  v1::ListWorkersResponse workers;
  for (const char* id : {"w0", "w1"}) {
    v1::WorkerInfo* w = workers.add_workers();
    w->set_job("demo");
    w->set_worker_id(id);
    w->mutable_device()->set_kind("cuda");
    w->mutable_device()->set_host("gpu-host");
    w->mutable_device()->set_node("3f0c9d2e-5b7a-4c1e-9d8f-0a1b2c3d4e5f");
    w->mutable_device()->set_memory_bytes(int64_t{80} << 30);
    w->set_lease_remaining_ms(5500);
    w->set_plan_version(3);
  }
  workers.mutable_workers(0)->set_speed_factor(0.87);
  v1::WorkerStepStats* step = workers.mutable_workers(0)->mutable_last_step();
  step->set_step(42);
  step->set_plan_version(3);
  step->set_step_seconds(0.075);
  step->set_ns_seconds(0.04125);
  step->set_predicted_ns_seconds(0.0375);
  step->set_bytes_moved(int64_t{7} << 30);
  return workers;
}

// The table's lines split into blank-separated cells.
std::vector<std::vector<std::string>> Cells(const std::string& table) {
  std::vector<std::vector<std::string>> lines;
  for (absl::string_view line :
       absl::StrSplit(table, '\n', absl::SkipEmpty())) {
    lines.push_back(absl::StrSplit(line, ' ', absl::SkipEmpty()));
  }
  return lines;
}

TEST(CostModelErrorTest, IsMeasuredOverPredictedMinusOneAndNoneWithoutPlan) {
  v1::WorkerStepStats step;
  step.set_ns_seconds(0.045);
  step.set_predicted_ns_seconds(0.05);
  ASSERT_TRUE(CostModelError(step).has_value());
  EXPECT_NEAR(*CostModelError(step), -0.1, 1e-12);
  step.set_predicted_ns_seconds(0);  // the plan gave this worker no batch
  EXPECT_EQ(CostModelError(step), std::nullopt);
}

TEST(WorkersTableTest, ShowsLastStepComputeBesidePredictionAndError) {
  const std::vector<std::vector<std::string>> lines =
      Cells(WorkersTable(TwoWorkers()));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            (std::vector<std::string>{
                "JOB", "WORKER", "KIND", "HOST", "NODE", "MEMORY", "LEASE",
                "PLAN", "SPEED", "STEP", "COMPUTE", "PREDICTED", "ERROR"}));
  // 41.25 / 37.5 - 1 = +10%.
  EXPECT_EQ(lines[1], (std::vector<std::string>{
                          "demo", "w0", "cuda", "gpu-host", "3f0c9d2e-5b7",
                          "80.0", "GiB", "5500", "ms", "3", "0.870", "42",
                          "41.250", "ms", "37.500", "ms", "+10.0%"}));
  // No step reported yet: dashes, not zeros.
  EXPECT_EQ(lines[2],
            (std::vector<std::string>{"demo", "w1", "cuda", "gpu-host",
                                      "3f0c9d2e-5b7", "80.0", "GiB", "5500",
                                      "ms", "3", "-", "-", "-", "-", "-"}));
}

TEST(WorkersTableTest, MarksADrainingWorker) {
  v1::ListWorkersResponse workers = TwoWorkers();
  workers.mutable_workers(1)->set_draining(true);
  const std::vector<std::vector<std::string>> lines =
      Cells(WorkersTable(workers));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1][1], "w0");
  EXPECT_EQ(lines[2][1], "w1(draining)");
}

TEST(WorkersTableTest, NoPredictionShowsNoError) {
  v1::ListWorkersResponse workers = TwoWorkers();
  workers.mutable_workers(0)->mutable_last_step()->set_predicted_ns_seconds(0);
  const std::vector<std::vector<std::string>> lines =
      Cells(WorkersTable(workers));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(lines[1].end() - 5, lines[1].end()),
            (std::vector<std::string>{"41.250", "ms", "0.000", "ms", "-"}));
}

TEST(WorkersTableTest, ExplainsACostModelFarFromItsDevice) {
  v1::ListWorkersResponse workers = TwoWorkers();
  EXPECT_THAT(WorkersTable(workers), Not(HasSubstr("--cost_table")));
  // A CPU worker predicted at a GPU's rate: +6900%.
  workers.mutable_workers(0)->mutable_last_step()->set_ns_seconds(2.625);
  const std::string table = WorkersTable(workers);
  EXPECT_THAT(table, HasSubstr("+6900.0%"));
  EXPECT_THAT(table, HasSubstr("muonps-autotune"));
  EXPECT_THAT(table, HasSubstr("--cost_table FILE"));
}

// A plan of one 2-D matrix and one stack of four experts: two tensors, five
// matrices (the count `muonps jobs` shows).
TEST(PlanTableTest, CountsTensorsAndTheirMatrices) {
  v1::Plan plan;
  plan.set_name("demo");
  v1::MatrixPlacement* dense = plan.add_matrices();
  dense->set_name("w");
  dense->add_owners("w0");
  v1::MatrixPlacement* experts = plan.add_matrices();
  experts->set_name("experts");
  for (const char* owner : {"w0", "w1", "w0", "w1"}) experts->add_owners(owner);
  EXPECT_THAT(PlanTable(plan), HasSubstr("2 tensors (5 matrices)"));
}

TEST(PlanTableTest, SaysHowManyNodesAndTheBucketBound) {
  v1::Plan plan;
  plan.add_workers("w0");
  plan.add_workers("w1");
  EXPECT_THAT(PlanTable(plan), HasSubstr("2 workers on 1 node, "));
  EXPECT_THAT(PlanTable(plan), HasSubstr("buckets of at most the job's bound"));
  plan.set_nodes(2);
  plan.set_bucket_bytes(int64_t{256} << 20);
  EXPECT_THAT(PlanTable(plan), HasSubstr("2 workers on 2 nodes, "));
  EXPECT_THAT(PlanTable(plan), HasSubstr("buckets of at most 256.0 MiB"));
  plan.set_network_gbs(12.5);
  EXPECT_THAT(PlanTable(plan),
              HasSubstr("2 workers on 2 nodes (12.5 GB/s a worker between "
                        "them), "));
}

TEST(PlanTableTest, ShowsTheOwnerGroupsWhenThePlanHasThem) {
  v1::Plan plan;
  for (const char* w : {"w0", "w1", "w2", "w3"}) plan.add_workers(w);
  EXPECT_THAT(PlanTable(plan), Not(HasSubstr("owner groups")));
  for (int g = 0; g < 2; ++g) {
    v1::OwnerGroup* group = plan.add_owner_groups();
    group->add_workers(absl::StrCat("w", 2 * g));
    group->add_workers(absl::StrCat("w", 2 * g + 1));
  }
  EXPECT_THAT(PlanTable(plan),
              HasSubstr("\nowner groups: 2 x 2 (w0 w1; w2 w3); owners below "
                        "are the first group's\n\nRANK"));
}

TEST(PlanTableTest, ShowsTheExchangeNodesWhenThePlanHasThem) {
  v1::Plan plan;
  for (const char* w : {"w0", "w1", "w2", "w3"}) plan.add_workers(w);
  EXPECT_THAT(PlanTable(plan), Not(HasSubstr("two levels")));
  for (int k = 0; k < 2; ++k) {
    v1::NodeWorkers* node = plan.add_exchange_nodes();
    node->add_workers(absl::StrCat("w", k));
    node->add_workers(absl::StrCat("w", k + 2));
  }
  EXPECT_THAT(PlanTable(plan),
              HasSubstr("\nexchange nodes (unreduced gradients summed in "
                        "two levels, row_sharded rows relayed): 2 nodes of 2 "
                        "(w0 w2; w1 w3)\n"));
}

TEST(PlanTableTest, ShowsTheTrainerShardsOfWholeExperts) {
  v1::Plan plan;
  for (const char* w : {"w0", "w1"}) {
    plan.add_workers(w);
    plan.add_loads()->set_worker_id(w);
  }
  EXPECT_THAT(PlanTable(plan), Not(HasSubstr("SHARD")));
  plan.set_trainer_shards(2);
  plan.mutable_loads(0)->set_trainer_shard(1);
  plan.mutable_loads(1)->set_trainer_shard(-1);
  const std::string table = PlanTable(plan);
  EXPECT_THAT(table, HasSubstr("trainers hold whole experts in 2 shards"));
  EXPECT_THAT(table, HasSubstr("LINK/STEP  SHARD\n"));
  EXPECT_THAT(table, HasSubstr("      1\n1     w1"));
  EXPECT_THAT(table, HasSubstr("      -\n"));
}

TEST(WorkersJsonTest, CarriesLastStepFieldsOnlyWhereReported) {
  const std::string json = ToJson(TwoWorkers());
  for (const char* field :
       {"\"last_step\"", "\"step\": \"42\"", "\"step_seconds\": 0.075",
        "\"ns_seconds\": 0.04125", "\"predicted_ns_seconds\": 0.0375",
        "\"bytes_moved\": \"7516192768\""}) {
    EXPECT_THAT(json, HasSubstr(field));
  }
  v1::ListWorkersResponse none = TwoWorkers();
  none.mutable_workers(0)->clear_last_step();
  EXPECT_THAT(ToJson(none), Not(HasSubstr("last_step")));
}

}  // namespace
}  // namespace cli
}  // namespace muonps
