// Plans and the workers' nodes: every worker reports the machine it runs
// on (Device.node), the plan counts the nodes its ranks span, and across
// nodes it cuts the step's buckets by the predicted step
// (scheduler::ChooseStepGrouping) unless the job names a bound.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_fixture.h"
#include "server/coordinator/plan_computation.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::Join;
using coordinator_test::kGiB;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(TopologyOfTest, EqualNamesAreOneNodeAndAnUnnamedRankOneOfItsOwn) {
  EXPECT_THAT(TopologyOf({"a", "b", "a", "", "b", ""}).node,
              ElementsAre(0, 1, 0, 2, 1, 3));
  // Nobody named a node (workers from before Device.node): one node.
  EXPECT_THAT(TopologyOf({"", "", ""}).node, IsEmpty());
  EXPECT_EQ(TopologyOf({"", "", ""}).nodes(), 1);
}

// 32 4096 x 4096 fp32 matrices (2 GiB of gradients; row-sharded unless
// `layout` says) on `workers` workers, `per_node` to a node.
class PlanTopologyTest : public CoordinatorTest {
 protected:
  v1::Plan PlanOn(int workers, int per_node, int64_t bucket_bytes = 0,
                  v1::Layout layout = v1::LAYOUT_ROW_SHARDED) {
    v1::JobSpec spec = Spec("x", 32, 4096, 4096);
    for (v1::Matrix& m : *spec.mutable_matrices()) m.set_layout(layout);
    spec.set_bucket_bytes(bucket_bytes);
    EXPECT_TRUE(state_->CreateJob(Create(spec)).ok());
    for (int w = 0; w < workers; ++w) {
      v1::JoinJobRequest join = Join("x", absl::StrCat("w", w), 64 * kGiB);
      join.mutable_device()->set_node(absl::StrCat("node-", w / per_node));
      EXPECT_TRUE(state_->JoinJob(join).ok()) << w;
    }
    return CurrentPlan("x");
  }
};

TEST_F(PlanTopologyTest, OneNodeCutsTheMeasuredSixtyFourMiBBuckets) {
  const v1::Plan plan = PlanOn(8, 8);
  EXPECT_EQ(plan.nodes(), 1);
  EXPECT_EQ(plan.bucket_bytes(), 64 * kMiB);
  EXPECT_EQ(plan.buckets_size(), 32);  // one 64 MiB matrix each
}

TEST_F(PlanTopologyTest, AcrossNodesRowGathersGoInFewerLargerPhases) {
  // Each of 16 nodes' GPUs gathers its rows over its own NIC: one phase
  // per 64 MiB would wait 32 times for one owner's port.
  const v1::Plan plan = PlanOn(32, 2);
  EXPECT_EQ(plan.nodes(), 16);
  EXPECT_GT(plan.bucket_bytes(), 64 * kMiB);
  EXPECT_LT(plan.buckets_size(), 32);
  int64_t largest = 0;
  for (const v1::Bucket& b : plan.buckets()) {
    largest = std::max(largest, b.bytes());
  }
  EXPECT_LE(largest, plan.bucket_bytes());
}

TEST_F(PlanTopologyTest, PlansWeighTheCoordinatorsLinks) {
  // Replicated matrices over 16 nodes. With the default links (a ring's
  // fill per phase) one phase of everything wins. On a network of 1 GB/s
  // per GPU with no latency (--network_gbs=1) the updates are what costs:
  // smaller buckets send them back while later stacks compute.
  const v1::Plan fast = PlanOn(32, 2, 0, v1::LAYOUT_REPLICATED);
  EXPECT_EQ(fast.bucket_bytes(), 2048 * kMiB);
  EXPECT_EQ(fast.buckets_size(), 1);
  CoordinatorOptions options = Options();
  options.links.inter_node_gbs = 1;
  options.links.latency_us = 0;
  options.links.hop_latency_us = 0;
  Reset(options);
  const v1::Plan slow = PlanOn(32, 2, 0, v1::LAYOUT_REPLICATED);
  EXPECT_LT(slow.bucket_bytes(), fast.bucket_bytes());
  EXPECT_GT(slow.buckets_size(), 1);
}

TEST_F(PlanTopologyTest, AJobsOwnBoundStandsOnAnyTopology) {
  const v1::Plan plan = PlanOn(32, 2, 128 * kMiB);
  EXPECT_EQ(plan.nodes(), 16);
  EXPECT_EQ(plan.bucket_bytes(), 128 * kMiB);
  EXPECT_EQ(plan.buckets_size(), 16);
}

TEST_F(CoordinatorTest, ListWorkersShowsEachWorkersNode) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  join.mutable_device()->set_node("rack3-host7");
  ASSERT_TRUE(state_->JoinJob(join).ok());
  v1::ListWorkersRequest list;
  list.set_job("x");
  const absl::StatusOr<v1::ListWorkersResponse> workers =
      state_->ListWorkers(list);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_EQ(workers->workers(0).device().node(), "rack3-host7");
  EXPECT_EQ(CurrentPlan("x").nodes(), 1);
}

TEST_F(CoordinatorTest, ANodeNameOverTwoHundredFiftySixBytesIsRefused) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  join.mutable_device()->set_node(std::string(257, 'n'));
  EXPECT_THAT(state_->JoinJob(join).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "device.node"));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
