#include "scheduler/step_clock.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/model_shapes.h"
#include "scheduler/planner.h"

namespace muonps {
namespace scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(TopologyTest, BlocksCountNodesAndTheirLargest) {
  const Topology t = Topology::Blocks(10, 4);
  EXPECT_THAT(t.node, ElementsAre(0, 0, 0, 0, 1, 1, 1, 1, 2, 2));
  EXPECT_EQ(t.nodes(), 3);
  EXPECT_EQ(t.most_per_node(), 4);
  EXPECT_TRUE(t.SameNode(4, 7));
  EXPECT_FALSE(t.SameNode(3, 4));
  const Topology unknown;
  EXPECT_EQ(unknown.nodes(), 1);
  EXPECT_TRUE(unknown.SameNode(0, 5));
}

struct Job {
  std::vector<MatrixSpec> matrices;
  OwnershipPlan plan;
  CostModel model{nullptr, DeviceRates{}, 1.0, 5};
  std::vector<const CostModel*> models;
};

Job Plan(int workers, Layout layout, int layers) {
  Job job;
  job.matrices = Llama3_8B(layers);
  for (MatrixSpec& m : job.matrices) m.layout = layout;
  PlanInput input;
  input.matrices = job.matrices;
  for (int w = 0; w < workers; ++w) {
    WorkerSpec spec;
    spec.id = "w" + std::to_string(w);
    spec.memory_bytes = int64_t{140} << 30;
    input.workers.push_back(spec);
  }
  job.plan = *PlanOwnership(input);
  job.models.assign(workers, &job.model);
  return job;
}

TEST(StepGroupingTest, OneNodeKeepsTheMeasuredBoundWithoutClocking) {
  const Job job = Plan(8, Layout::kReplicated, 2);
  ClockSettings settings;
  settings.topology = Topology::Blocks(8, 8);
  const StepGrouping g =
      *ChooseStepGrouping(job.matrices, job.plan, job.models, settings);
  EXPECT_EQ(g.bucket_bytes, int64_t{64} << 20);
  EXPECT_THAT(g.candidates, IsEmpty());
}

TEST(StepGroupingTest, ChoosesTheCandidateWhoseClockedStepIsShortest) {
  const Job job = Plan(32, Layout::kRowSharded, 4);
  ClockSettings settings;
  settings.topology = Topology::Blocks(32, 8);
  const StepGrouping g =
      *ChooseStepGrouping(job.matrices, job.plan, job.models, settings);
  // One bucket of all 1.6 GiB of gradients, then 64 MiB x 16, 4, 1, until
  // two in a row do not beat the best.
  ASSERT_THAT(g.candidates, Not(IsEmpty()));
  EXPECT_GT(g.candidates.front().first, int64_t{1} << 30);
  for (const auto& [bound, predicted] : g.candidates) {
    const StepSchedule schedule =
        *BuildStepSchedule(job.matrices, job.plan, {.bucket_bytes = bound});
    const StepClock clock =
        ClockStep(job.matrices, schedule, StackSeconds(schedule, job.models),
                  32, settings);
    EXPECT_DOUBLE_EQ(clock.predicted_seconds, predicted) << bound;
    EXPECT_GE(predicted, g.predicted_seconds) << bound;
    if (predicted == g.predicted_seconds) {
      EXPECT_GE(bound, g.bucket_bytes) << "ties go to the smaller bound";
    }
  }
  // The schedule it returns is the chosen bound's, though later candidates
  // were cut after it: the same buckets, order and ready buckets.
  ASSERT_NE(g.bucket_bytes, g.candidates.back().first)
      << "the best is not the last candidate here";
  const StepSchedule want = *BuildStepSchedule(
      job.matrices, job.plan, {.bucket_bytes = g.bucket_bytes});
  ASSERT_EQ(g.schedule.buckets.size(), want.buckets.size());
  for (size_t k = 0; k < want.buckets.size(); ++k) {
    EXPECT_EQ(g.schedule.buckets[k].matrices, want.buckets[k].matrices) << k;
    EXPECT_EQ(g.schedule.buckets[k].to_owners.size(),
              want.buckets[k].to_owners.size())
        << k;
    EXPECT_EQ(g.schedule.buckets[k].from_owners.size(),
              want.buckets[k].from_owners.size())
        << k;
  }
  ASSERT_EQ(g.schedule.order.size(), want.order.size());
  for (size_t i = 0; i < want.order.size(); ++i) {
    EXPECT_EQ(g.schedule.order[i].kind, want.order[i].kind) << i;
    EXPECT_EQ(g.schedule.order[i].index, want.order[i].index) << i;
  }
  ASSERT_EQ(g.schedule.stacks.size(), want.stacks.size());
  for (size_t s = 0; s < want.stacks.size(); ++s) {
    EXPECT_EQ(g.schedule.stacks[s].ready_bucket, want.stacks[s].ready_bucket)
        << s;
  }
}

TEST(StepGroupingTest, ManyNodesGroupRowGathersIntoFewPhases) {
  // Every row gather of a bucket waits for its owners' NICs; across 32
  // nodes one bucket of everything lets all owners receive at once.
  const Job job = Plan(256, Layout::kRowSharded, 4);
  ClockSettings settings;
  settings.topology = Topology::Blocks(256, 8);
  const StepGrouping g =
      *ChooseStepGrouping(job.matrices, job.plan, job.models, settings);
  EXPECT_EQ(g.bucket_bytes, g.candidates.front().first);
  EXPECT_LT(g.predicted_seconds, 0.5 * g.candidates.back().second);
}

TEST(StepClockTest, RowsBetweenNodesGoOverTheNics) {
  // One matrix, owner 0, four ranks: rows from ranks 1-3 to the owner.
  // Same node: NVLink only; rank r alone on node r: NICs, at 1/100 the
  // rate here, so the gather takes 100x as long.
  std::vector<MatrixSpec> matrices(1);
  matrices[0].name = "w";
  matrices[0].rows = 1024;
  matrices[0].cols = 1024;
  matrices[0].layout = Layout::kRowSharded;
  OwnershipPlan plan;
  plan.matrix_names = {"w"};
  plan.worker_ids = {"a", "b", "c", "d"};
  plan.owners = {{0}};
  const StepSchedule schedule = *BuildStepSchedule(matrices, plan);
  ClockSettings settings;
  settings.topology.links.latency_us = 0;
  settings.topology.links.hop_latency_us = 0;
  settings.topology.links.nvlink_gbs = 100;
  settings.topology.links.inter_node_gbs = 1;
  const std::vector<double> no_compute(schedule.stacks.size(), 0.0);
  settings.topology = Topology{{0, 0, 0, 0}, settings.topology.links};
  const StepClock one_node =
      ClockStep(matrices, schedule, no_compute, 4, settings);
  settings.topology = Topology{{0, 1, 2, 3}, settings.topology.links};
  const StepClock four_nodes =
      ClockStep(matrices, schedule, no_compute, 4, settings);
  const double rows_in = 1024.0 * 1024 * 4 * 3 / 4;  // fp32 gradient rows
  EXPECT_DOUBLE_EQ(one_node.gradients_landed_seconds, rows_in / 100e9);
  EXPECT_DOUBLE_EQ(four_nodes.gradients_landed_seconds, rows_in / 1e9);
  EXPECT_EQ(one_node.bytes_per_gpu, four_nodes.bytes_per_gpu);
}

// `workers` on nodes of `per_node`, planned as the coordinator plans them:
// one owner group's workers by the planner, then the plan copied to every
// group (ChooseOwnerGroupings' first, one node a group; one group of every
// worker when it gives none).
Job GroupedPlan(int workers, int per_node, Layout layout, int layers) {
  std::vector<MatrixSpec> matrices = Llama3_8B(layers);
  for (MatrixSpec& m : matrices) m.layout = layout;
  const std::vector<OwnerGrouping> groupings = ChooseOwnerGroupings(
      matrices, Topology::Blocks(workers, per_node), workers, 0);
  OwnerGrouping groups = groupings.empty() ? OwnerGrouping{} : groupings[0];
  if (groups.empty()) {
    groups.emplace_back();
    for (int w = 0; w < workers; ++w) groups[0].push_back(w);
  }
  Job job = Plan(static_cast<int>(groups[0].size()), layout, layers);
  std::vector<std::string> ids;
  for (int w = 0; w < workers; ++w) ids.push_back("w" + std::to_string(w));
  job.plan = ReplicateOverGroups(job.plan, groups, ids);
  job.models.assign(workers, &job.model);
  return job;
}

TEST(OwnerGroupsClockTest, ReplicatedGroupPerNodeClocksAsOneNodeAlone) {
  // 16 workers on 2 nodes, all replicated: each node's 8 workers own every
  // matrix, so each node's step is the 8-worker step of one node: the same
  // stage, the same bytes per GPU (nothing over the NICs), the bound of
  // one node without clocking.
  ClockSettings one;
  one.topology = Topology::Blocks(8, 8);
  const Job alone = GroupedPlan(8, 8, Layout::kReplicated, 8);
  ASSERT_THAT(alone.plan.groups, IsEmpty());
  const StepGrouping a =
      *ChooseStepGrouping(alone.matrices, alone.plan, alone.models, one);
  const StepClock clock_alone =
      ClockStep(alone.matrices, a.schedule,
                StackSeconds(a.schedule, alone.models), 8, one);

  ClockSettings two;
  two.topology = Topology::Blocks(16, 8);
  const Job grouped = GroupedPlan(16, 8, Layout::kReplicated, 8);
  ASSERT_EQ(grouped.plan.groups.size(), 2u);
  const StepGrouping g =
      *ChooseStepGrouping(grouped.matrices, grouped.plan, grouped.models, two);
  EXPECT_EQ(g.bucket_bytes, a.bucket_bytes);
  EXPECT_THAT(g.candidates, IsEmpty());
  EXPECT_EQ(g.schedule.groups, grouped.plan.groups);
  const StepClock clock_grouped =
      ClockStep(grouped.matrices, g.schedule,
                StackSeconds(g.schedule, grouped.models), 16, two);
  EXPECT_DOUBLE_EQ(clock_grouped.stage_seconds, clock_alone.stage_seconds);
  EXPECT_DOUBLE_EQ(clock_grouped.predicted_seconds,
                   clock_alone.predicted_seconds);
  EXPECT_EQ(clock_grouped.bytes_per_gpu, clock_alone.bytes_per_gpu);
  EXPECT_DOUBLE_EQ(clock_grouped.transfer_seconds,
                   clock_alone.transfer_seconds);
  EXPECT_EQ(clock_grouped.phases, clock_alone.phases);
  EXPECT_EQ(clock_grouped.limited_by, clock_alone.limited_by);
  // Both nodes compute the same stacks in the same time.
  for (int w = 0; w < 8; ++w) {
    EXPECT_DOUBLE_EQ(clock_grouped.worker_compute_end_seconds[w],
                     clock_alone.worker_compute_end_seconds[w]);
    EXPECT_DOUBLE_EQ(clock_grouped.worker_compute_end_seconds[w + 8],
                     clock_alone.worker_compute_end_seconds[w]);
  }
}

// The stage of `job` on `settings` with the bound ChooseStepGrouping picks.
StepClock GroupedStage(const Job& job, const ClockSettings& settings) {
  const StepGrouping g =
      *ChooseStepGrouping(job.matrices, job.plan, job.models, settings);
  return ClockStep(job.matrices, g.schedule,
                   StackSeconds(g.schedule, job.models),
                   static_cast<int>(job.plan.worker_ids.size()), settings);
}

TEST(OwnerGroupsClockTest, GroupsPerNodeTradeComputeSpreadForTheNics) {
  // 8 layers on 64 workers (8 nodes). Grouped, each node's step is the
  // step of its 8 workers alone, whatever the NICs: they carry nothing.
  // Without groups, 64 owners split the compute but every update crosses
  // the NICs: on 50 GB/s ports that wins (compute 1/8 of a node's, the
  // updates' ring S/8 a port); on 6.25 GB/s (50 Gb/s) ports the updates
  // take longer than a node's whole stage.
  ClockSettings settings;
  settings.topology = Topology::Blocks(64, 8);
  const Job grouped = GroupedPlan(64, 8, Layout::kReplicated, 8);
  ASSERT_EQ(grouped.plan.groups.size(), 8u);
  ClockSettings one;
  one.topology = Topology::Blocks(8, 8);
  const StepClock alone = GroupedStage(Plan(8, Layout::kReplicated, 8), one);
  const Job flat = Plan(64, Layout::kReplicated, 8);
  for (const double nic_gbs : {50.0, 6.25}) {
    settings.topology.links.inter_node_gbs = nic_gbs;
    const StepClock with_groups = GroupedStage(grouped, settings);
    EXPECT_DOUBLE_EQ(with_groups.stage_seconds, alone.stage_seconds) << nic_gbs;
    EXPECT_EQ(with_groups.bytes_per_gpu, alone.bytes_per_gpu) << nic_gbs;
    const StepClock without = GroupedStage(flat, settings);
    EXPECT_EQ(without.limited_by, "updates_back") << nic_gbs;
    EXPECT_LT(without.critical_compute_seconds,
              0.25 * with_groups.critical_compute_seconds)
        << nic_gbs;
    if (nic_gbs == 50) {
      EXPECT_LT(without.stage_seconds, with_groups.stage_seconds);
    } else {
      EXPECT_LT(with_groups.stage_seconds, 0.5 * without.stage_seconds);
    }
  }
}

// One replicated 1024 x 1024 matrix owned by rank 0 of 4, the plan copied
// to groups {0, 1} and {2, 3}.
struct TwoGroups {
  std::vector<MatrixSpec> matrices;
  OwnershipPlan plan;
  StepSchedule schedule;
};

TwoGroups MakeTwoGroups() {
  TwoGroups t;
  t.matrices.resize(1);
  t.matrices[0].name = "w";
  t.matrices[0].rows = 1024;
  t.matrices[0].cols = 1024;
  OwnershipPlan half;
  half.matrix_names = {"w"};
  half.worker_ids = {"a", "b"};
  half.owners = {{0}};
  t.plan = ReplicateOverGroups(half, {{0, 1}, {2, 3}}, {"a", "b", "c", "d"});
  t.schedule = *BuildStepSchedule(t.matrices, t.plan);
  return t;
}

TEST(OwnerGroupsClockTest, APhaseTakesItsSlowestGroupsPart) {
  // Group {0, 1} on one node broadcasts over NVLink; group {2, 3} spans
  // two nodes and broadcasts over the NICs, 100x slower: the phase takes
  // the NIC's time, and each rank moves its own group's update once.
  const TwoGroups t = MakeTwoGroups();
  ASSERT_EQ(t.schedule.buckets.size(), 1u);
  ASSERT_EQ(t.schedule.buckets[0].from_owners.size(), 2u);
  EXPECT_EQ(t.schedule.buckets[0].from_owners[1].group, 1);
  EXPECT_EQ(t.schedule.buckets[0].from_owners[1].owner, 2);
  ClockSettings settings;
  settings.peer_writes = false;
  LinkFigures& l = settings.topology.links;
  l.latency_us = 0;
  l.hop_latency_us = 0;
  l.nvlink_gbs = 100;
  l.inter_node_gbs = 1;
  settings.topology.node = {0, 0, 1, 2};
  const std::vector<double> no_compute(t.schedule.stacks.size(), 0.0);
  const double update = 1024.0 * 1024 * 2;  // bf16
  const StepClock clock =
      ClockStep(t.matrices, t.schedule, no_compute, 4, settings);
  EXPECT_DOUBLE_EQ(clock.transfer_seconds, update / 1e9);
  EXPECT_DOUBLE_EQ(clock.stage_seconds, update / 1e9);
  EXPECT_EQ(clock.phases, 1);
  EXPECT_EQ(clock.bytes_per_gpu, static_cast<int64_t>(update));
  // Both groups on one node each: NVLink only.
  settings.topology.node = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(
      ClockStep(t.matrices, t.schedule, no_compute, 4, settings).stage_seconds,
      update / 100e9);
  // Every latency once per group's part: the slowest part's counts.
  l.latency_us = 1;
  l.hop_latency_us = 2;
  EXPECT_NEAR(ClockStep(t.matrices, t.schedule, no_compute, 4, settings)
                  .latency_seconds,
              1e-6 + 2e-6, 1e-15);
}

TEST(OwnerGroupsClockTest, PeerWritesWithinTheGroupsOnOneNode) {
  // Group {0, 1} on one node writes its update with the copy engines;
  // group {2, 3} spans two nodes and broadcasts it over the NICs.
  const TwoGroups t = MakeTwoGroups();
  ClockSettings settings;
  LinkFigures& l = settings.topology.links;
  l.latency_us = 0;
  l.hop_latency_us = 0;
  l.copy_engine_gbs = 10;
  l.nvlink_gbs = 100;
  l.inter_node_gbs = 1;
  const std::vector<double> no_compute(t.schedule.stacks.size(), 0.0);
  const double update = 1024.0 * 1024 * 2;
  settings.topology.node = {0, 0, 1, 1};
  const StepClock both =
      ClockStep(t.matrices, t.schedule, no_compute, 4, settings);
  // Each owner copies one update into its one other member's staging.
  EXPECT_DOUBLE_EQ(both.stage_seconds, update / 10e9);
  EXPECT_DOUBLE_EQ(both.transfer_seconds, update / 10e9);
  EXPECT_EQ(both.phases, 1);
  EXPECT_EQ(both.bytes_per_gpu, static_cast<int64_t>(update));
  settings.topology.node = {0, 0, 1, 2};
  const StepClock mixed =
      ClockStep(t.matrices, t.schedule, no_compute, 4, settings);
  EXPECT_DOUBLE_EQ(mixed.stage_seconds, update / 1e9);
  EXPECT_EQ(mixed.bytes_per_gpu, static_cast<int64_t>(update));
}

TEST(PlanOnTopologyTest, RequiredGroupsAreOneGrouping) {
  const Job job = Plan(4, Layout::kReplicated, 1);
  ClockSettings settings;
  settings.topology = Topology::Blocks(4, 2);
  const std::vector<OwnerGrouping> two = ChooseOwnerGroupings(
      job.matrices, Topology::Blocks(4, 1), 4, /*dedicated=*/0);
  ASSERT_EQ(two.size(), 2u);  // groups of 1 and of 2 nodes of 1
  const absl::StatusOr<TopologyPlan> planned = PlanOnTopology(
      job.matrices, job.plan.worker_ids, 0, job.models, settings, {}, two,
      OwnerGroupsUse::kRequired,
      [&](const std::vector<int32_t>&, const OwnerGrouping*, bool) {
        return absl::StatusOr<OwnershipPlan>(job.plan);
      });
  EXPECT_EQ(planned.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(planned.status().message()),
              ::testing::HasSubstr("2 groupings required"));
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
