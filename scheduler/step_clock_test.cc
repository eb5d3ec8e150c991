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

}  // namespace
}  // namespace scheduler
}  // namespace muonps
