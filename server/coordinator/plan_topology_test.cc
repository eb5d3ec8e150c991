// Plans and the workers' nodes: every worker reports the machine it runs
// on (Device.node), the plan counts the nodes its ranks span, across nodes
// it cuts the step's buckets by the predicted step
// (scheduler::ChooseStepGrouping) unless the job names a bound, and a job
// whose gradients are all replicated on nodes of as many workers each gets
// owner groups of whole nodes (scheduler::ChooseOwnerGroupings).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/translate.h"
#include "scheduler/step_schedule.h"
#include "server/coordinator/coordinator_fixture.h"
#include "server/coordinator/plan_computation.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::Join;
using coordinator_test::kGiB;
using coordinator_test::Leave;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::AnyOf;
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
  // `network_gbs[w]`, where given, is what worker w reports
  // (Device.network_gbs).
  v1::Plan PlanOn(int workers, int per_node, int64_t bucket_bytes = 0,
                  v1::Layout layout = v1::LAYOUT_ROW_SHARDED,
                  const std::vector<double>& network_gbs = {}) {
    v1::JobSpec spec = Spec("x", 32, 4096, 4096);
    for (v1::Matrix& m : *spec.mutable_matrices()) m.set_layout(layout);
    spec.set_bucket_bytes(bucket_bytes);
    EXPECT_TRUE(state_->CreateJob(Create(spec)).ok());
    for (int w = 0; w < workers; ++w) {
      v1::JoinJobRequest join = Join("x", absl::StrCat("w", w), 64 * kGiB);
      join.mutable_device()->set_node(absl::StrCat("node-", w / per_node));
      if (w < static_cast<int>(network_gbs.size())) {
        join.mutable_device()->set_network_gbs(network_gbs[w]);
      }
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
  // Replicated matrices over 17 nodes, the last with one worker (so no
  // owner groups: updates cross the nodes). With the default links (a
  // ring's fill per phase) few phases win: 256 MiB ones, whose updates land
  // early enough for the workers to apply them before the votes beside the
  // later ones (one phase of everything won while every update was applied
  // at the commit). On a network of 1 GB/s per GPU with no latency
  // (--network_gbs=1) the updates are what costs: smaller buckets send
  // them back while later stacks compute.
  const v1::Plan fast = PlanOn(33, 2, 0, v1::LAYOUT_REPLICATED);
  EXPECT_EQ(fast.owner_groups_size(), 0);
  EXPECT_EQ(fast.bucket_bytes(), 256 * kMiB);
  EXPECT_EQ(fast.buckets_size(), 8);
  EXPECT_FALSE(fast.apply_at_commit());
  CoordinatorOptions options = Options();
  options.links.inter_node_gbs = 1;
  options.links.latency_us = 0;
  options.links.hop_latency_us = 0;
  Reset(options);
  const v1::Plan slow = PlanOn(33, 2, 0, v1::LAYOUT_REPLICATED);
  EXPECT_LT(slow.bucket_bytes(), fast.bucket_bytes());
  EXPECT_GT(slow.buckets_size(), 1);
}

TEST_F(PlanTopologyTest, AJobsOwnBoundStandsOnAnyTopology) {
  const v1::Plan plan = PlanOn(32, 2, 128 * kMiB);
  EXPECT_EQ(plan.nodes(), 16);
  EXPECT_EQ(plan.bucket_bytes(), 128 * kMiB);
  EXPECT_EQ(plan.buckets_size(), 16);
}

// Worker ids of `group`, in position order.
std::vector<std::string> Members(const v1::OwnerGroup& group) {
  return {group.workers().begin(), group.workers().end()};
}

// Owner groups are weighed by the predicted step: on the default links
// (50 GB/s a GPU across nodes) the 32 matrices' Newton-Schulz spread over
// all four workers beats each node computing every update itself, so the
// groups are declined; on a 1 GB/s network the updates crossing it are
// what costs, and each node owns every matrix.
TEST_F(PlanTopologyTest, OwnerGroupsAreTakenOnlyWhereTheStepIsShorter) {
  const v1::Plan fast = PlanOn(4, 2, 0, v1::LAYOUT_REPLICATED);
  EXPECT_EQ(fast.owner_groups_size(), 0);
  EXPECT_EQ(fast.network_gbs(), 50);  // the coordinator's default
  CoordinatorOptions options = Options();
  options.links.inter_node_gbs = 1;
  Reset(options);
  EXPECT_EQ(PlanOn(4, 2, 0, v1::LAYOUT_REPLICATED).owner_groups_size(), 2);
}

// What the workers report of their network (Device.network_gbs) replaces
// the coordinator's --network_gbs where every ranked worker reported: the
// least of them, which the plan names. A worker that reports nothing
// leaves the coordinator's figure; on one node none is weighed.
TEST_F(PlanTopologyTest, PlansWeighTheLeastNetworkTheWorkersReported) {
  const v1::Plan slow = PlanOn(4, 2, 0, v1::LAYOUT_REPLICATED, {50, 1, 50, 50});
  EXPECT_EQ(slow.network_gbs(), 1);
  EXPECT_EQ(slow.owner_groups_size(), 2);  // as on --network_gbs=1
  Reset(Options());
  const v1::Plan partly = PlanOn(4, 2, 0, v1::LAYOUT_REPLICATED, {1, 1, 1});
  EXPECT_EQ(partly.network_gbs(), 50);
  EXPECT_EQ(partly.owner_groups_size(), 0);
  Reset(Options());
  EXPECT_EQ(PlanOn(2, 2, 0, v1::LAYOUT_REPLICATED, {1, 1}).network_gbs(), 0);
}

TEST(ReportedNetworkGbsTest, TheLeastWhereEveryRankReported) {
  EXPECT_EQ(ReportedNetworkGbs({50, 12.5, 25}), 12.5);
  EXPECT_EQ(ReportedNetworkGbs({50, 0, 25}), 0);
  EXPECT_EQ(ReportedNetworkGbs({}), 0);
}

TEST_F(PlanTopologyTest, ReplicatedOnEqualNodesGetsOneOwnerGroupPerNode) {
  CoordinatorOptions options = Options();
  options.links.inter_node_gbs = 1;  // where the groups win
  Reset(options);
  const v1::Plan plan = PlanOn(4, 2, 0, v1::LAYOUT_REPLICATED);
  EXPECT_EQ(plan.nodes(), 2);
  ASSERT_EQ(plan.owner_groups_size(), 2);
  EXPECT_THAT(Members(plan.owner_groups(0)), ElementsAre("w0", "w1"));
  EXPECT_THAT(Members(plan.owner_groups(1)), ElementsAre("w2", "w3"));
  // One owner per matrix, in the first group.
  ASSERT_EQ(plan.matrices_size(), 32);
  std::set<std::string> owners;
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    ASSERT_EQ(m.owners_size(), 1) << m.name();
    EXPECT_THAT(m.owners(0), AnyOf("w0", "w1")) << m.name();
    owners.insert(m.owners(0));
  }
  EXPECT_EQ(owners.size(), 2u);
  // The batches are the first group's (the second group's members run
  // those of the first's at their position); every worker has its load.
  std::set<std::string> computing;
  for (const v1::Batch& b : plan.batches()) computing.insert(b.worker_id());
  EXPECT_THAT(computing, ElementsAre("w0", "w1"));
  ASSERT_EQ(plan.loads_size(), 4);
  for (int w = 0; w < 4; ++w) {
    EXPECT_GT(plan.loads(w).momentum_bytes(), 0) << w;
    EXPECT_EQ(plan.loads(w).momentum_bytes(),
              plan.loads(w % 2).momentum_bytes())
        << w;
  }
  // What a worker reads of it makes a step schedule with both groups.
  const std::vector<scheduler::MatrixSpec> matrices =
      proto::MatricesFromJob(Spec("x", 32, 4096, 4096));  // replicated
  absl::StatusOr<scheduler::OwnershipPlan> read =
      proto::OwnershipFromPlan(plan, matrices);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(read->groups, ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3)));
  absl::StatusOr<scheduler::StepSchedule> schedule =
      scheduler::BuildStepSchedule(matrices, *read,
                                   {.bucket_bytes = plan.bucket_bytes()});
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_EQ(schedule->groups, read->groups);
}

// Each worker reports what its device had free, which differs with what
// else the device holds, and sends its own copy of the cost table: the
// owners of a row_sharded job are still dealt over both nodes.
TEST_F(PlanTopologyTest, OwnersAreDealtOverNodesWhateverMemoryEachHadFree) {
  v1::JobSpec spec = Spec("x", 4, 4096, 4096);
  for (v1::Matrix& m : *spec.mutable_matrices()) {
    m.set_layout(v1::LAYOUT_ROW_SHARDED);
  }
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  for (int w = 0; w < 16; ++w) {
    v1::JoinJobRequest join =
        Join("x", absl::StrCat("w", w), 64 * kGiB - int64_t{w} * 5 * kMiB);
    join.mutable_device()->set_node(absl::StrCat("node-", w / 8));
    join.set_cost_table(
        R"({"rows": 4096, "cols": 4096, "algorithm": "gram", "batch": 1, )"
        R"("seconds": 0.004})");
    ASSERT_TRUE(state_->JoinJob(join).ok()) << w;
  }
  const v1::Plan plan = CurrentPlan("x");
  ASSERT_EQ(plan.nodes(), 2);
  std::map<int, int64_t> link_by_node;
  for (const v1::WorkerLoad& load : plan.loads()) {
    int w = -1;
    ASSERT_TRUE(absl::SimpleAtoi(load.worker_id().substr(1), &w))
        << load.worker_id();
    link_by_node[w / 8] += load.link_bytes();
  }
  EXPECT_GT(link_by_node[0], 0);
  EXPECT_EQ(link_by_node[0], link_by_node[1]) << plan.DebugString();
}

// A position stands for its member of every group: the second node's
// worker with 2 GiB bounds what its position holds on the first node too.
TEST_F(PlanTopologyTest, EachPositionFitsItsSmallestMember) {
  CoordinatorOptions options = Options();
  options.links.inter_node_gbs = 1;  // where the groups win
  Reset(options);
  v1::JobSpec spec = Spec("x", 32, 4096, 4096);
  for (v1::Matrix& m : *spec.mutable_matrices()) {
    m.set_layout(v1::LAYOUT_REPLICATED);
  }
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  for (int w = 0; w < 4; ++w) {
    v1::JoinJobRequest join =
        Join("x", absl::StrCat("w", w), (w == 3 ? 2 : 64) * kGiB);
    join.mutable_device()->set_node(absl::StrCat("node-", w / 2));
    ASSERT_TRUE(state_->JoinJob(join).ok()) << w;
  }
  const v1::Plan plan = CurrentPlan("x");
  ASSERT_EQ(plan.owner_groups_size(), 2);
  ASSERT_EQ(plan.loads_size(), 4);
  EXPECT_LE(plan.loads(3).memory_bytes(), 2 * kGiB);
  EXPECT_EQ(plan.loads(1).memory_bytes(), plan.loads(3).memory_bytes());
  EXPECT_GT(plan.loads(0).memory_bytes(), plan.loads(1).memory_bytes());
}

TEST_F(PlanTopologyTest, NoOwnerGroupsWithoutReplicatedGradientsOnEqualNodes) {
  EXPECT_EQ(PlanOn(4, 2).owner_groups_size(), 0);  // row-sharded
  Reset(Options());
  EXPECT_EQ(PlanOn(4, 2, 0, v1::LAYOUT_UNREDUCED).owner_groups_size(), 0);
  Reset(Options());
  const v1::Plan unequal = PlanOn(4, 3, 0, v1::LAYOUT_REPLICATED);  // 3 + 1
  EXPECT_EQ(unequal.nodes(), 2);
  EXPECT_EQ(unequal.owner_groups_size(), 0);
  Reset(Options());
  const v1::Plan one_node = PlanOn(4, 4, 0, v1::LAYOUT_REPLICATED);
  EXPECT_EQ(one_node.nodes(), 1);
  EXPECT_EQ(one_node.owner_groups_size(), 0);
}

TEST_F(PlanTopologyTest, OneRowShardedMatrixAmongReplicatedOnesMeansNoGroups) {
  v1::JobSpec spec = Spec("x", 4, 1024, 1024);
  for (v1::Matrix& m : *spec.mutable_matrices()) {
    m.set_layout(v1::LAYOUT_REPLICATED);
  }
  spec.mutable_matrices(2)->set_layout(v1::LAYOUT_ROW_SHARDED);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  for (int w = 0; w < 4; ++w) {
    v1::JoinJobRequest join = Join("x", absl::StrCat("w", w));
    join.mutable_device()->set_node(absl::StrCat("node-", w / 2));
    ASSERT_TRUE(state_->JoinJob(join).ok()) << w;
  }
  EXPECT_EQ(CurrentPlan("x").nodes(), 2);
  EXPECT_EQ(CurrentPlan("x").owner_groups_size(), 0);
}

// Re-plans of a grouped job: a standby of the second node taking a rank
// keeps the groups and every owner (the first group's did not change), a
// drain plans without groups, and the drained worker's leave (3 + 1 nodes)
// too.
TEST_F(PlanTopologyTest, ReplansKeepOwnersWhileTheGroupsStay) {
  v1::JobSpec spec = Spec("x", 8);
  spec.set_trainers(4);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  for (const auto& [worker, node] :
       std::vector<std::pair<std::string, std::string>>{
           {"w0", "a"}, {"w1", "a"}, {"w2", "b"}, {"w3", "b"}, {"w4", "b"}}) {
    v1::JoinJobRequest join = Join("x", worker);
    join.mutable_device()->set_node(node);
    ASSERT_TRUE(state_->JoinJob(join).ok()) << worker;
  }
  const v1::Plan before = CurrentPlan("x");
  ASSERT_EQ(before.owner_groups_size(), 2);
  EXPECT_THAT(Members(before.owner_groups(1)), ElementsAre("w2", "w3"));
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w3")).ok());
  const v1::Plan after = CurrentPlan("x");
  EXPECT_GT(after.version(), before.version());
  ASSERT_EQ(after.owner_groups_size(), 2);
  EXPECT_THAT(Members(after.owner_groups(0)), ElementsAre("w0", "w1"));
  EXPECT_THAT(Members(after.owner_groups(1)), ElementsAre("w2", "w4"));
  ASSERT_EQ(after.matrices_size(), before.matrices_size());
  for (int m = 0; m < after.matrices_size(); ++m) {
    EXPECT_EQ(after.matrices(m).owners(0), before.matrices(m).owners(0)) << m;
  }
  EXPECT_EQ(after.moved_bytes(), 0);

  v1::LeaveJobRequest drain = Leave("x", "w4");
  drain.set_drain(true);
  ASSERT_TRUE(state_->LeaveJob(drain).ok());
  const v1::Plan drained = CurrentPlan("x");
  EXPECT_EQ(drained.owner_groups_size(), 0);
  EXPECT_EQ(drained.workers_size(), 4);
  for (const v1::MatrixPlacement& m : drained.matrices()) {
    EXPECT_NE(m.owners(0), "w4") << m.name();
  }
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w4")).ok());
  const v1::Plan left = CurrentPlan("x");
  EXPECT_EQ(left.workers_size(), 3);
  EXPECT_EQ(left.owner_groups_size(), 0);
}

TEST_F(PlanTopologyTest, OwnerGroupsSpanSeveralNodesWhereThatStepIsShortest) {
  // 16 nodes of one worker each, replicated, on a network whose every ring
  // hop costs 1 ms: the plan of all 16 pays 15 hops a phase, one node a
  // group computes all 32 updates on one GPU; groups of a few nodes each
  // split the compute and keep their rings short.
  CoordinatorOptions options = Options();
  options.links.hop_latency_us = 1000;
  Reset(options);
  const v1::Plan plan = PlanOn(16, 1, 0, v1::LAYOUT_REPLICATED);
  EXPECT_EQ(plan.nodes(), 16);
  ASSERT_GT(plan.owner_groups_size(), 1);
  ASSERT_LT(plan.owner_groups_size(), 16);
  const int size = plan.owner_groups(0).workers_size();
  std::set<std::string> seen;
  for (int g = 0; g < plan.owner_groups_size(); ++g) {
    const std::vector<std::string> members = Members(plan.owner_groups(g));
    ASSERT_EQ(static_cast<int>(members.size()), size);
    // Whole nodes by number: node-k's worker wk, k = g * size ...
    for (int s = 0; s < size; ++s) {
      EXPECT_EQ(members[s], absl::StrCat("w", g * size + s));
      seen.insert(members[s]);
    }
  }
  EXPECT_EQ(seen.size(), 16u);
  // Every matrix's owners name the first group's workers.
  const std::vector<std::string> first = Members(plan.owner_groups(0));
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    ASSERT_EQ(m.owners_size(), 1);
    EXPECT_NE(std::find(first.begin(), first.end(), m.owners(0)), first.end());
  }
}

TEST_F(CoordinatorTest, ListWorkersShowsEachWorkersNodeAndNetwork) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  join.mutable_device()->set_node("rack3-host7");
  join.mutable_device()->set_network_gbs(12.5);
  ASSERT_TRUE(state_->JoinJob(join).ok());
  v1::ListWorkersRequest list;
  list.set_job("x");
  const absl::StatusOr<v1::ListWorkersResponse> workers =
      state_->ListWorkers(list);
  ASSERT_TRUE(workers.ok()) << workers.status();
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_EQ(workers->workers(0).device().node(), "rack3-host7");
  EXPECT_EQ(workers->workers(0).device().network_gbs(), 12.5);
  EXPECT_EQ(CurrentPlan("x").nodes(), 1);
}

TEST_F(CoordinatorTest, ANodeNameOverTwoHundredFiftySixBytesIsRefused) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  join.mutable_device()->set_node(std::string(257, 'n'));
  EXPECT_THAT(state_->JoinJob(join).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "device.node"));
}

TEST_F(CoordinatorTest, ANetworkRateThatIsNegativeOrNotFiniteIsRefused) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  for (const double gbs : {-1.0, std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN()}) {
    v1::JoinJobRequest join = Join("x", "w1");
    join.mutable_device()->set_network_gbs(gbs);
    EXPECT_THAT(
        state_->JoinJob(join).status(),
        StatusIs(absl::StatusCode::kInvalidArgument, "device.network_gbs"))
        << gbs;
  }
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
