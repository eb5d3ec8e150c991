// Owner groups (OwnershipPlan::groups): a plan of one group's workers made
// the plan of every worker (ReplicateOverGroups), each group's stacks and
// transfers in the step schedule, the plans a schedule refuses, and the
// groupings a job gets on its nodes (ChooseOwnerGroupings).
#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/plan_types.h"
#include "scheduler/planner.h"
#include "scheduler/step_clock.h"
#include "scheduler/step_schedule.h"
#include "scheduler/step_schedule_fixture.h"

namespace muonps {
namespace scheduler {
namespace {

using schedule_test::Matrix;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Four replicated matrices in three layers, two of one shape.
std::vector<MatrixSpec> ReplicatedMatrices() {
  return {
      Matrix("l0.a", 64, 128, DType::kFloat32, Layout::kReplicated, 0),
      Matrix("l1.a", 64, 128, DType::kFloat32, Layout::kReplicated, 1),
      Matrix("l1.b", 128, 96, DType::kBFloat16, Layout::kReplicated, 1),
      Matrix("l2.a", 32, 32, DType::kFloat32, Layout::kReplicated, 2),
  };
}

// The planner's plan of two workers, replicated over two groups of two:
// ranks {3, 0} and {1, 2} (a group need not be consecutive ranks).
class OwnerGroupsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    input_.matrices = ReplicatedMatrices();
    for (const char* id : {"a", "b"}) {
      WorkerSpec w;
      w.id = id;
      input_.workers.push_back(w);
    }
    absl::StatusOr<OwnershipPlan> one = PlanOwnership(input_);
    ASSERT_TRUE(one.ok()) << one.status();
    one_ = *std::move(one);
    plan_ =
        ReplicateOverGroups(one_, {{3, 0}, {1, 2}}, {"w0", "w1", "w2", "w3"});
  }

  PlanInput input_;
  OwnershipPlan one_, plan_;
};

TEST_F(OwnerGroupsTest, ReplicatingRenumbersOwnersAndBatchesAndCopiesLoads) {
  ASSERT_TRUE(CheckOwnerGroups(plan_).ok()) << CheckOwnerGroups(plan_);
  EXPECT_THAT(plan_.groups, ElementsAre(ElementsAre(3, 0), ElementsAre(1, 2)));
  const std::vector<int32_t> rank_of_position = {3, 0};
  for (size_t m = 0; m < plan_.owners.size(); ++m) {
    EXPECT_EQ(plan_.owners[m][0], rank_of_position[one_.owners[m][0]]) << m;
  }
  // The first group's batches, once: the second group's members run the
  // batches of the first group's member at their position.
  ASSERT_EQ(plan_.batches.size(), one_.batches.size());
  for (const Batch& b : plan_.batches) {
    EXPECT_TRUE(b.worker == 3 || b.worker == 0) << b.worker;
  }
  // Position 0 is rank 3 in the first group and rank 1 in the second.
  ASSERT_EQ(plan_.worker_seconds.size(), 4u);
  EXPECT_EQ(plan_.worker_seconds[3], one_.worker_seconds[0]);
  EXPECT_EQ(plan_.worker_seconds[1], one_.worker_seconds[0]);
  EXPECT_EQ(plan_.worker_seconds[0], one_.worker_seconds[1]);
  EXPECT_EQ(plan_.worker_seconds[2], one_.worker_seconds[1]);
  const OwnerGroups groups(plan_);
  EXPECT_EQ(groups.count(), 2);
  EXPECT_EQ(groups.group_of(2), 1);
  EXPECT_EQ(groups.OwnerIn(3, 1), 1);
  EXPECT_EQ(groups.OwnerIn(0, 1), 2);
  EXPECT_TRUE(groups.Owns(1, 3));
  EXPECT_FALSE(groups.Owns(2, 3));
  EXPECT_EQ(groups.InFirstGroup(1), 3);
  EXPECT_EQ(groups.InFirstGroup(2), 0);
  EXPECT_EQ(groups.InFirstGroup(3), 3);
  // A batch of another group's worker is refused: the plan lists the
  // first group's alone.
  OwnershipPlan copied = plan_;
  Batch other = copied.batches[0];
  other.worker = groups.OwnerIn(other.worker, 1);
  copied.batches.push_back(other);
  const absl::Status refused =
      BuildStepSchedule(ReplicatedMatrices(), copied).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("not in the first owner group"));
}

TEST_F(OwnerGroupsTest, OneGroupOfEveryWorkerInOrderIsNoGroups) {
  const OwnershipPlan same = ReplicateOverGroups(one_, {{0, 1}}, {"a", "b"});
  EXPECT_THAT(same.groups, IsEmpty());
  EXPECT_EQ(same.owners, one_.owners);
  const OwnerGroups groups(same);
  EXPECT_EQ(groups.count(), 1);
  EXPECT_THAT(groups.members(0), ElementsAre(0, 1));
}

TEST_F(OwnerGroupsTest, EveryGroupHasItsOwnStacksAndTransfers) {
  absl::StatusOr<StepSchedule> one =
      BuildStepSchedule(input_.matrices, one_, {.bucket_bytes = 64 << 10});
  ASSERT_TRUE(one.ok()) << one.status();
  absl::StatusOr<StepSchedule> both =
      BuildStepSchedule(input_.matrices, plan_, {.bucket_bytes = 64 << 10});
  ASSERT_TRUE(both.ok()) << both.status();
  // Each stack of the one-group schedule, then its copy in the second group.
  ASSERT_EQ(both->stacks.size(), 2 * one->stacks.size());
  const std::vector<int32_t> first = {3, 0}, second = {1, 2};
  for (size_t s = 0; s < one->stacks.size(); ++s) {
    const OwnerStack& a = both->stacks[2 * s];
    const OwnerStack& b = both->stacks[2 * s + 1];
    EXPECT_EQ(a.owner, first[one->stacks[s].owner]) << s;
    EXPECT_EQ(b.owner, second[one->stacks[s].owner]) << s;
    for (const OwnerStack* x : {&a, &b}) {
      EXPECT_EQ(x->ready_bucket, one->stacks[s].ready_bucket) << s;
      ASSERT_EQ(x->items.size(), one->stacks[s].items.size()) << s;
      ASSERT_EQ(x->chunks.size(), one->stacks[s].chunks.size()) << s;
    }
  }
  // The same buckets; every update goes back once per group, from that
  // group's owner, and no gradient moves (every trainer holds it).
  ASSERT_EQ(both->buckets.size(), one->buckets.size());
  for (size_t k = 0; k < one->buckets.size(); ++k) {
    EXPECT_THAT(both->buckets[k].to_owners, IsEmpty());
    const std::vector<Transfer>& x = both->buckets[k].from_owners;
    const std::vector<Transfer>& y = one->buckets[k].from_owners;
    ASSERT_EQ(x.size(), 2 * y.size()) << k;
    for (size_t i = 0; i < y.size(); ++i) {
      // Per matrix: its experts in the first group, then in the second.
      const Transfer& g0 = x[2 * i];
      const Transfer& g1 = x[2 * i + 1];
      EXPECT_EQ(g0.group, 0);
      EXPECT_EQ(g1.group, 1);
      EXPECT_EQ(g0.owner, first[y[i].owner]);
      EXPECT_EQ(g1.owner, second[y[i].owner]);
      EXPECT_EQ(g0.kind, TransferKind::kBroadcastFromOwner);
      EXPECT_EQ(g1.item.matrix, y[i].item.matrix);
    }
  }
  // Compute phases: every stack once.
  int computes = 0;
  for (const Phase& p : both->order) computes += p.kind == PhaseKind::kCompute;
  EXPECT_EQ(computes, static_cast<int>(both->stacks.size()));
}

TEST_F(OwnerGroupsTest, SchedulesRefuseGroupsThatDoNotHold) {
  const auto refused = [&](OwnershipPlan plan, const std::string& field,
                           const std::string& says) {
    const absl::Status s = BuildStepSchedule(input_.matrices, plan).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(field)) << s;
    EXPECT_THAT(s.message(), HasSubstr(says)) << s;
  };
  OwnershipPlan plan = plan_;
  plan.groups = {{3, 0}, {1}};
  refused(plan, "plan.groups[1]", "has 1 workers; the first has 2");
  plan.groups = {{3, 0}, {1, 0}};
  refused(plan, "plan.groups[1]", "worker 0 is also in group 0");
  plan.groups = {{3, 0}, {1, 7}};
  refused(plan, "plan.groups[1]", "7 is not a worker index");
  plan.groups = {{3}, {1}, {0}};
  refused(plan, "plan.groups", "worker 2 is in no group");
  plan.groups = {{1, 2}, {3, 0}};
  refused(plan, "plan.groups", "owners name the first group's workers");
  plan = plan_;
  plan.dedicated = 1;
  refused(plan, "plan.groups", "dedicated");
  std::vector<MatrixSpec> mixed = input_.matrices;
  mixed[2].layout = Layout::kUnreduced;
  const absl::Status s = BuildStepSchedule(mixed, plan_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("\"l1.b\" is unreduced")) << s;
  // Row-sharded matrices split within each group (HSDP): gathered to and
  // scattered from the group's owner.
  mixed[2].layout = Layout::kRowSharded;
  absl::StatusOr<StepSchedule> hsdp = BuildStepSchedule(mixed, plan_);
  ASSERT_TRUE(hsdp.ok()) << hsdp.status();
  int gathers = 0;
  for (const Bucket& b : hsdp->buckets) {
    for (const Transfer& t : b.to_owners) {
      EXPECT_EQ(t.kind, TransferKind::kGatherToOwner);
      ++gathers;
    }
  }
  EXPECT_EQ(gathers, 2);  // one per group
  // Exchange nodes with groups: each node within one group (its rows
  // relayed within the group), not across two.
  OwnershipPlan nodes = plan_;
  nodes.exchange_nodes = {{3}, {0}, {1}, {2}};
  EXPECT_TRUE(BuildStepSchedule(mixed, nodes).ok());
  nodes.exchange_nodes = {{3, 0}, {1, 2}};
  EXPECT_TRUE(BuildStepSchedule(mixed, nodes).ok());
  nodes.exchange_nodes = {{0, 1}, {2, 3}};
  refused(nodes, "plan.exchange_nodes", "node 0 spans owner groups 0 and 1");
}

TEST(ChooseOwnerGroupingsTest, WholeNodesOnlyForReplicatedJobsOnEqualNodes) {
  const std::vector<MatrixSpec> replicated = ReplicatedMatrices();
  EXPECT_THAT(ChooseOwnerGroupings(replicated, Topology::Blocks(4, 2), 4, 0),
              ElementsAre(ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3))));
  Topology interleaved;
  interleaved.node = {0, 1, 0, 1};
  EXPECT_THAT(ChooseOwnerGroupings(replicated, interleaved, 4, 0),
              ElementsAre(ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3))));
  // One node, unequal nodes, a dedicated worker, a matrix not replicated.
  EXPECT_THAT(ChooseOwnerGroupings(replicated, Topology::Blocks(4, 4), 4, 0),
              IsEmpty());
  EXPECT_THAT(ChooseOwnerGroupings(replicated, Topology::Blocks(3, 2), 3, 0),
              IsEmpty());
  EXPECT_THAT(ChooseOwnerGroupings(replicated, Topology::Blocks(4, 2), 4, 1),
              IsEmpty());
  std::vector<MatrixSpec> mixed = replicated;
  mixed[0].layout = Layout::kUnreduced;
  EXPECT_THAT(ChooseOwnerGroupings(mixed, Topology::Blocks(4, 2), 4, 0),
              IsEmpty());
  EXPECT_THAT(ChooseOwnerGroupings(replicated, Topology{}, 4, 0), IsEmpty());
}

TEST(ChooseOwnerGroupingsTest, GroupsOfEveryDivisorOfTheNodesBelowAll) {
  const std::vector<MatrixSpec> replicated = ReplicatedMatrices();
  // 6 nodes of 2: groups of 1, 2 and 3 nodes, smallest first.
  const std::vector<OwnerGrouping> six =
      ChooseOwnerGroupings(replicated, Topology::Blocks(12, 2), 12, 0);
  ASSERT_EQ(six.size(), 3u);
  EXPECT_EQ(six[0].size(), 6u);
  EXPECT_THAT(six[1],
              ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7),
                          ElementsAre(8, 9, 10, 11)));
  EXPECT_THAT(six[2], ElementsAre(ElementsAre(0, 1, 2, 3, 4, 5),
                                  ElementsAre(6, 7, 8, 9, 10, 11)));
  // Nodes numbered out of rank order: a group takes nodes by number, its
  // workers in rank order.
  Topology shuffled;
  shuffled.node = {3, 0, 2, 1, 3, 0, 2, 1};
  EXPECT_THAT(ChooseOwnerGroupings(replicated, shuffled, 8, 0),
              ElementsAre(ElementsAre(ElementsAre(1, 5), ElementsAre(3, 7),
                                      ElementsAre(2, 6), ElementsAre(0, 4)),
                          ElementsAre(ElementsAre(1, 3, 5, 7),
                                      ElementsAre(0, 2, 4, 6))));
  // A prime number of nodes: one node a group only.
  EXPECT_EQ(
      ChooseOwnerGroupings(replicated, Topology::Blocks(10, 2), 10, 0).size(),
      1u);
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
