#include "scheduler/step_clock.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/model_shapes.h"
#include "scheduler/node_exchange.h"
#include "scheduler/planner.h"

namespace muonps {
namespace scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
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

// `nodes` (by rank; empty: one node): the planner knows them, as the
// coordinator's does (PlanInput::nodes).
Job Plan(int workers, Layout layout, int layers,
         const std::vector<int32_t>& nodes = {}) {
  Job job;
  job.matrices = Llama3_8B(layers);
  for (MatrixSpec& m : job.matrices) m.layout = layout;
  PlanInput input;
  input.matrices = job.matrices;
  input.nodes = nodes;
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

// PlanOnTopology of `job`'s plan (its plan of every rank, as it is) on
// `settings`, no owner groups offered.
absl::StatusOr<TopologyPlan> OnTopology(const Job& job,
                                        const ClockSettings& settings) {
  return PlanOnTopology(
      job.matrices, job.plan.worker_ids, 0, job.models, settings,
      {.bucket_bytes = 0}, {}, OwnerGroupsUse::kWeighed,
      [&](const std::vector<int32_t>&, const OwnerGrouping*, bool) {
        return absl::StatusOr<OwnershipPlan>(job.plan);
      });
}

TEST(StackSecondsTest, NewtonSchulzAndTheMomentumPassOverMemory) {
  // Every stack: its Newton-Schulz calls by its owner's model, and the
  // momentum's fp32 reads and writes (16 bytes an element; 8 more for the
  // mean of an unreduced gradient) at the HBM rate, over the owner's speed.
  for (const Layout layout : {Layout::kReplicated, Layout::kUnreduced}) {
    const Job job = Plan(2, layout, 2);
    const CostModel slow(nullptr, DeviceRates{}, 0.5, 5);
    const std::vector<const CostModel*> models = {&job.model, &slow};
    ClockSettings settings;
    settings.hbm_bytes_per_second = 2e12;
    const StepSchedule schedule = *BuildStepSchedule(job.matrices, job.plan);
    const std::vector<double> seconds =
        StackSeconds(job.matrices, schedule, models, settings);
    ASSERT_EQ(seconds.size(), schedule.stacks.size());
    const double bytes = layout == Layout::kUnreduced ? 24 : 16;
    for (size_t i = 0; i < seconds.size(); ++i) {
      const OwnerStack& stack = schedule.stacks[i];
      const CostModel& model = *models[stack.owner];
      double ns = 0;
      for (const StackChunk& chunk : stack.chunks) {
        ns += model.NsSeconds(stack.rows, stack.cols, chunk.count,
                              chunk.algorithm);
      }
      const double elements =
          static_cast<double>(stack.items.size() * stack.rows * stack.cols);
      EXPECT_NEAR(seconds[i], ns + elements * bytes / 2e12 / model.speed(),
                  1e-12 * seconds[i])
          << i;
    }
  }
}

TEST(StepClockTest, OneWorkerRunsNoControlRounds) {
  // A step alone on its worker is decided once its gradients are checked:
  // its commit is the applies alone; two workers add the rounds.
  ClockSettings settings;
  settings.control_rounds_ms = 4;
  settings.control_message_us = 6.3;
  settings.control_tree_fanout = 16;
  EXPECT_EQ(ControlSeconds(1, settings), 0);
  EXPECT_DOUBLE_EQ(ControlSeconds(2, settings), 4e-3 + 2 * 2 * 6.3e-6);
  const Job job = Plan(1, Layout::kReplicated, 2);
  const StepSchedule schedule = *BuildStepSchedule(job.matrices, job.plan);
  const std::vector<double> stacks =
      StackSeconds(job.matrices, schedule, job.models, settings);
  const StepClock clock =
      ClockStep(job.matrices, schedule, stacks, 1, settings);
  double compute = 0;
  for (const double s : stacks) compute += s;
  EXPECT_DOUBLE_EQ(clock.stage_seconds, compute);
  EXPECT_DOUBLE_EQ(clock.commit_seconds,
                   ApplySeconds(job.matrices, 1, settings));
  EXPECT_DOUBLE_EQ(clock.predicted_seconds,
                   compute + ApplySeconds(job.matrices, 1, settings));
}

// Clocks `job`'s schedule on `workers` of one node with the control rounds'
// fixed part `control_ms`, of which `agreement_ms` the agreement's.
StepClock ClockWithRounds(const Job& job, int workers, double control_ms,
                          double agreement_ms) {
  ClockSettings settings;
  settings.control_rounds_ms = control_ms;
  settings.agreement_ms = agreement_ms;
  const StepSchedule schedule = *BuildStepSchedule(job.matrices, job.plan);
  const std::vector<double> stacks =
      StackSeconds(job.matrices, schedule, job.models, settings);
  return ClockStep(job.matrices, schedule, stacks, workers, settings);
}

TEST(StepClockTest, EverythingWaitsForTheAgreementOfUnreducedGradients) {
  // Every transfer and stack waits for the agreement: the stage moves by
  // it, and the commit is the vote alone.
  const Job job = Plan(2, Layout::kUnreduced, 2);
  const StepClock none = ClockWithRounds(job, 2, 4, 0);
  const StepClock agreed = ClockWithRounds(job, 2, 4, 2.5);
  EXPECT_DOUBLE_EQ(none.agreement_seconds, 0);
  EXPECT_DOUBLE_EQ(agreed.agreement_seconds, 2.5e-3);
  EXPECT_THAT(agreed.worker_stage_begin_seconds, ElementsAre(2.5e-3, 2.5e-3));
  EXPECT_NEAR(agreed.gradients_landed_seconds,
              none.gradients_landed_seconds + 2.5e-3, 1e-12);
  EXPECT_NEAR(agreed.stage_seconds, none.stage_seconds + 2.5e-3, 1e-12);
  EXPECT_NEAR(agreed.commit_seconds, none.commit_seconds - 2.5e-3, 1e-12);
  EXPECT_NEAR(agreed.predicted_seconds, none.predicted_seconds, 1e-12);
  EXPECT_EQ(agreed.limited_by, none.limited_by);
}

TEST(StepClockTest,
     AFirstStackOfReplicatedGradientsComputesWhileTheRanksAgree) {
  // Each worker's first stack reads its trainer's gradients in place and
  // starts at 0; an agreement shorter than it costs nothing, and the
  // commit is the vote alone.
  const Job job = Plan(2, Layout::kReplicated, 2);
  const StepClock none = ClockWithRounds(job, 2, 1.5, 0);
  const StepClock agreed = ClockWithRounds(job, 2, 4, 2.5);
  EXPECT_THAT(agreed.worker_stage_begin_seconds, ElementsAre(0, 0));
  ASSERT_GT(agreed.compute_end_seconds_max, 2.5e-3);
  EXPECT_DOUBLE_EQ(agreed.stage_seconds, none.stage_seconds);
  EXPECT_DOUBLE_EQ(agreed.commit_seconds, none.commit_seconds);
  EXPECT_DOUBLE_EQ(agreed.predicted_seconds, none.predicted_seconds);
  // An agreement longer than every first stack: the rest of each worker's
  // stacks wait for it, the first does not.
  const StepClock longer = ClockWithRounds(job, 2, 1001.5, 1000);
  const StepSchedule schedule = *BuildStepSchedule(job.matrices, job.plan);
  const std::vector<double> stacks =
      StackSeconds(job.matrices, schedule, job.models, ClockSettings{});
  for (int w = 0; w < 2; ++w) {
    double rest = 0;
    const std::vector<int>& own = longer.worker_stacks[w];
    ASSERT_GE(own.size(), 2u) << w;
    for (size_t k = 1; k < own.size(); ++k) rest += stacks[own[k]];
    ASSERT_LT(stacks[own[0]], 1.0) << w;
    EXPECT_NEAR(longer.worker_compute_end_seconds[w], 1.0 + rest, 1e-9) << w;
  }
  EXPECT_NEAR(longer.commit_seconds, none.commit_seconds, 1e-12);
}

TEST(StepClockTest, AWorkerWithoutATrainerComputesNothingAheadOfTheAgreement) {
  // A dedicated worker's replicated gradients are sent to it after the
  // agreement: its stage begins there, the trainers' workers' at 0.
  Job job = Plan(3, Layout::kReplicated, 2);
  job.plan.dedicated = 1;
  const StepClock clock = ClockWithRounds(job, 3, 4, 2.5);
  const StepSchedule schedule = *BuildStepSchedule(job.matrices, job.plan);
  bool sent = false;
  for (const Bucket& b : schedule.buckets) {
    for (const Transfer& x : b.to_owners) {
      sent = sent || (x.kind == TransferKind::kSendToOwner && x.owner == 2);
    }
  }
  ASSERT_TRUE(sent);
  EXPECT_THAT(clock.worker_stage_begin_seconds, ElementsAre(0, 0, 2.5e-3));
  EXPECT_GE(clock.worker_compute_end_seconds[2],
            2.5e-3 + clock.worker_compute_seconds[2]);
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
        ClockStep(job.matrices, schedule,
                  StackSeconds(job.matrices, schedule, job.models, settings),
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

// One 1024 x 1024 row_sharded matrix owned by rank 0 of four, and a clock
// of the phases alone (no agreement, no latencies) with NVLink at 100 GB/s
// and the NICs at 1.
struct OneGather {
  OneGather() {
    matrices[0].name = "w";
    matrices[0].rows = 1024;
    matrices[0].cols = 1024;
    matrices[0].layout = Layout::kRowSharded;
    plan.matrix_names = {"w"};
    plan.worker_ids = {"a", "b", "c", "d"};
    plan.owners = {{0}};
    settings.agreement_ms = 0;
    settings.topology.links.latency_us = 0;
    settings.topology.links.hop_latency_us = 0;
    settings.topology.links.nvlink_gbs = 100;
    settings.topology.links.inter_node_gbs = 1;
  }
  // The step of the plan's schedule on ranks at `nodes`.
  StepClock Clock(const std::vector<int32_t>& nodes) {
    const StepSchedule schedule = *BuildStepSchedule(matrices, plan);
    settings.topology = Topology{nodes, settings.topology.links};
    return ClockStep(matrices, schedule,
                     std::vector<double>(schedule.stacks.size(), 0.0), 4,
                     settings);
  }

  std::vector<MatrixSpec> matrices = std::vector<MatrixSpec>(1);
  OwnershipPlan plan;
  ClockSettings settings;
};

TEST(StepClockTest, RowsBetweenNodesGoOverTheNics) {
  // Rows from ranks 1-3 to the owner. Same node: NVLink only; rank r alone
  // on node r: NICs, at 1/100 the rate here, so the gather takes 100x as
  // long.
  OneGather g;
  const StepClock one_node = g.Clock({0, 0, 0, 0});
  const StepClock four_nodes = g.Clock({0, 1, 2, 3});
  const double rows_in = 1024.0 * 1024 * 4 * 3 / 4;  // fp32 gradient rows
  EXPECT_DOUBLE_EQ(one_node.gradients_landed_seconds, rows_in / 100e9);
  EXPECT_DOUBLE_EQ(four_nodes.gradients_landed_seconds, rows_in / 1e9);
  EXPECT_EQ(one_node.bytes_per_gpu, four_nodes.bytes_per_gpu);
}

TEST(StepClockTest, RowsFromOtherPositionsGoThroughRelays) {
  // Two nodes of two ({0, 1}, {2, 3}). Rank 1 (the owner's node) and rank
  // 2 (the owner's position on node 1) send straight; rank 3 sends to its
  // relay, rank 1, which passes the rows on in a second launch. So the
  // owner's NIC takes one rank's rows, not two: the first launch's busiest
  // NIC carries a quarter of the matrix (into the owner, and into the
  // relay), and the second a quarter over NVLink. The updates' rows come
  // back the reverse way.
  OneGather g;
  const StepClock straight = g.Clock({0, 0, 1, 1});
  g.plan.exchange_nodes = {{0, 1}, {2, 3}};
  EXPECT_EQ(BuildStepSchedule(g.matrices, g.plan)->buckets[0].to_owners[0].kind,
            TransferKind::kGatherToOwner);
  const StepClock through = g.Clock({0, 0, 1, 1});
  const double rank_rows = 1024.0 * 1024 * 4 / 4;  // one rank's fp32 rows
  EXPECT_DOUBLE_EQ(straight.gradients_landed_seconds, 2 * rank_rows / 1e9);
  EXPECT_DOUBLE_EQ(through.gradients_landed_seconds,
                   rank_rows / 1e9 + rank_rows / 100e9);
  // Each launch pays its latency.
  g.settings.topology.links.latency_us = 10;
  const StepClock with_latency = g.Clock({0, 0, 1, 1});
  EXPECT_NEAR(
      with_latency.gradients_landed_seconds - through.gradients_landed_seconds,
      20e-6, 1e-12);
}

TEST(PlanOnTopologyTest, RelaysRowsWhereTheOwnersPortsAreTheBottleneck) {
  // Two layers sharded by rows on 2 nodes of 8, planned with the nodes
  // known (owners dealt over them). Where the NICs are much slower than
  // NVLink the rows through the relays' ports win; where they run at
  // NVLink's rate the second launch only costs.
  for (const double nic_gbs : {50.0, 328.0}) {
    SCOPED_TRACE(absl::StrCat("NIC ", nic_gbs, " GB/s"));
    const int workers = 16;
    ClockSettings settings;
    settings.topology = Topology::Blocks(workers, 8);
    settings.topology.links.nvlink_gbs = 328;
    settings.topology.links.inter_node_gbs = nic_gbs;
    const Job job =
        Plan(workers, Layout::kRowSharded, 2, settings.topology.node);
    const absl::StatusOr<TopologyPlan> out = OnTopology(job, settings);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(out->weighed.exchange_offered);
    const bool relays = nic_gbs < 100;
    EXPECT_EQ(out->plan.exchange_nodes.empty(), !relays)
        << out->weighed.exchange_seconds << " against "
        << out->weighed.rings_seconds;
    EXPECT_EQ(out->weighed.exchange_seconds < out->weighed.rings_seconds,
              relays);
  }
}

// The relays' buffers are taken only where every worker has room for them
// beside its owned matrices: one byte short on one worker declines them,
// naming it and the bytes it lacks, and the plan keeps the straight
// gathers.
TEST(PlanOnTopologyTest, RelaysOnlyWhereEveryWorkerHasRoomForTheirBuffers) {
  const int workers = 16;
  ClockSettings settings;
  settings.topology = Topology::Blocks(workers, 8);
  settings.topology.links.nvlink_gbs = 328;
  settings.topology.links.inter_node_gbs = 50;
  const Job job = Plan(workers, Layout::kRowSharded, 2, settings.topology.node);
  settings.capacity_bytes.assign(workers, int64_t{1} << 50);
  const absl::StatusOr<TopologyPlan> roomy = OnTopology(job, settings);
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  ASSERT_FALSE(roomy->plan.exchange_nodes.empty());
  EXPECT_EQ(roomy->weighed.exchange_declined, "");
  const ExchangeBuffers buffers = ExchangeBuffersOf(
      roomy->grouping.schedule, job.matrices, workers, OwnerGroups(roomy->plan),
      workers, settings.update_bytes_per_element);
  // The worker that relays the most.
  int busiest = 0;
  for (int r = 0; r < workers; ++r) {
    if (buffers.relay[r] > buffers.relay[busiest]) busiest = r;
  }
  ASSERT_GT(buffers.Bytes(busiest), 4);
  const int64_t needed =
      job.plan.worker_memory_bytes[busiest] + buffers.Bytes(busiest);
  settings.capacity_bytes[busiest] = needed;
  const absl::StatusOr<TopologyPlan> just = OnTopology(job, settings);
  ASSERT_TRUE(just.ok()) << just.status();
  EXPECT_FALSE(just->plan.exchange_nodes.empty());
  settings.capacity_bytes[busiest] = needed - 1;
  const absl::StatusOr<TopologyPlan> short_of = OnTopology(job, settings);
  ASSERT_TRUE(short_of.ok()) << short_of.status();
  EXPECT_TRUE(short_of->plan.exchange_nodes.empty());
  EXPECT_TRUE(short_of->weighed.exchange_offered);
  EXPECT_LT(short_of->weighed.exchange_seconds,
            short_of->weighed.rings_seconds);
  EXPECT_THAT(short_of->weighed.exchange_declined,
              HasSubstr(absl::StrCat("worker \"", job.plan.worker_ids[busiest],
                                     "\" would need ", buffers.Bytes(busiest),
                                     " bytes")));
  EXPECT_THAT(short_of->weighed.exchange_declined, HasSubstr(", 1 more than"));
  EXPECT_TRUE(short_of->grouping.schedule.exchange_nodes.empty());
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
  const StepClock clock_alone = ClockStep(
      alone.matrices, a.schedule,
      StackSeconds(alone.matrices, a.schedule, alone.models, one), 8, one);

  ClockSettings two;
  two.topology = Topology::Blocks(16, 8);
  const Job grouped = GroupedPlan(16, 8, Layout::kReplicated, 8);
  ASSERT_EQ(grouped.plan.groups.size(), 2u);
  const StepGrouping g =
      *ChooseStepGrouping(grouped.matrices, grouped.plan, grouped.models, two);
  EXPECT_EQ(g.bucket_bytes, a.bucket_bytes);
  EXPECT_THAT(g.candidates, IsEmpty());
  EXPECT_EQ(g.schedule.groups, grouped.plan.groups);
  const StepClock clock_grouped = ClockStep(
      grouped.matrices, g.schedule,
      StackSeconds(grouped.matrices, g.schedule, grouped.models, two), 16, two);
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
                   StackSeconds(job.matrices, g.schedule, job.models, settings),
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
  settings.agreement_ms = 0;  // the phases alone
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
  settings.agreement_ms = 0;  // the phases alone
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

// One unreduced 1024 x 1024 matrix owned by rank 0 of `nodes` nodes of 2,
// its gradients summed by the exchange over those nodes.
struct OneExchanged {
  std::vector<MatrixSpec> matrices;
  OwnershipPlan plan;
  StepSchedule schedule;
};

OneExchanged MakeOneExchanged(int nodes) {
  OneExchanged t;
  t.matrices.resize(1);
  t.matrices[0].name = "w";
  t.matrices[0].rows = 1024;
  t.matrices[0].cols = 1024;
  t.matrices[0].layout = Layout::kUnreduced;
  t.plan.matrix_names = {"w"};
  t.plan.owners = {{0}};
  for (int k = 0; k < nodes; ++k) {
    t.plan.worker_ids.push_back("a" + std::to_string(k));
    t.plan.worker_ids.push_back("b" + std::to_string(k));
    t.plan.exchange_nodes.push_back({2 * k, 2 * k + 1});
  }
  t.schedule = *BuildStepSchedule(t.matrices, t.plan);
  return t;
}

TEST(ExchangeClockTest, PhaseCostsItsLaunchesLevelsPartsAndAdds) {
  // Two nodes of two: blocks of 2^19 elements. Each way 3 launches of one
  // hop each (within the nodes, along the rails, the parts within the
  // owner's node): a block within each node, a block over each NIC (a
  // ring of two), then block 1 from rank 1 to the owner over NVLink. HBM:
  // the pack copies and the adds of the step within the nodes only.
  const OneExchanged t = MakeOneExchanged(2);
  ASSERT_EQ(t.schedule.buckets.size(), 1u);
  EXPECT_EQ(t.schedule.buckets[0].to_owners[0].kind,
            TransferKind::kExchangeToOwner);
  EXPECT_EQ(t.schedule.buckets[0].from_owners[0].kind,
            TransferKind::kExchangeFromOwner);
  ClockSettings settings;
  settings.agreement_ms = 0;  // the phases alone
  settings.topology = Topology::Blocks(4, 2);
  LinkFigures& l = settings.topology.links;
  l.latency_us = 1;
  l.hop_latency_us = 2;
  l.nvlink_gbs = 100;
  l.inter_node_gbs = 10;
  settings.hbm_bytes_per_second = 1e12;
  const std::vector<double> no_compute(t.schedule.stacks.size(), 0.0);
  const StepClock clock =
      ClockStep(t.matrices, t.schedule, no_compute, 4, settings);
  const double e = 1024.0 * 1024;  // elements
  const double block = e / 2;
  const double gradients = 3 * 3e-6 + block * 4 / 100e9 + block * 4 / 10e9 +
                           block * 4 / 100e9 + (2 * e * 4 + 12 * block) / 1e12;
  const double updates = 3 * 3e-6 + block * 2 / 100e9 + block * 2 / 10e9 +
                         block * 2 / 100e9 + 2 * e * 2 / 1e12;
  EXPECT_NEAR(clock.gradients_landed_seconds, gradients, 1e-15);
  EXPECT_NEAR(clock.stage_seconds, gradients + updates, 1e-15);
  EXPECT_NEAR(clock.transfer_seconds, gradients + updates, 1e-15);
  EXPECT_NEAR(clock.latency_seconds, 2 * 3 * 3e-6, 1e-15);
  EXPECT_EQ(clock.phases, 2);
  EXPECT_EQ(clock.exchange_launches, 2 * 3);
  // Every member's levels (a block within the node and a block along its
  // rail: 4 MiB of gradients and 2 MiB of updates, each way); the owner
  // takes in 2 MiB of gradients within its node and sends 1 MiB of
  // updates back: 8 MiB in.
  EXPECT_EQ(clock.bytes_per_gpu, int64_t{1} << 23);
}

TEST(ExchangeClockTest, PartsAsEachRankMovesThem) {
  // Random buckets of small matrices on M nodes of G: each phase is its
  // levels, its HBM time and its launch of parts within the owners' nodes,
  // its busiest rank's, the parts moved one by one (NodeExchange::Parts) as
  // the workers move them.
  std::mt19937 rng(11);
  for (int round = 0; round < 1000; ++round) {
    const int m = std::uniform_int_distribution<int>(2, 5)(rng);
    const int g = std::uniform_int_distribution<int>(1, 3)(rng);
    const int n = m * g;
    const int count = std::uniform_int_distribution<int>(1, 12)(rng);
    std::vector<MatrixSpec> matrices(count);
    OwnershipPlan plan;
    for (int w = 0; w < n; ++w) plan.worker_ids.push_back(absl::StrCat(w));
    for (int k = 0; k < m; ++k) {
      plan.exchange_nodes.emplace_back();
      for (int p = 0; p < g; ++p) plan.exchange_nodes[k].push_back(k * g + p);
    }
    for (int i = 0; i < count; ++i) {
      matrices[i].name = absl::StrCat("m", i);
      matrices[i].rows = std::uniform_int_distribution<int>(1, 40)(rng);
      matrices[i].cols = 1;
      matrices[i].layout = Layout::kUnreduced;
      plan.matrix_names.push_back(matrices[i].name);
      plan.owners.push_back(
          {std::uniform_int_distribution<int>(0, n - 1)(rng)});
    }
    const StepSchedule schedule =
        *BuildStepSchedule(matrices, plan, {.bucket_bytes = int64_t{1} << 40});
    ASSERT_EQ(schedule.buckets.size(), 1u);
    ClockSettings settings;
    settings.agreement_ms = 0;  // the phases alone
    settings.topology = Topology::Blocks(n, g);
    LinkFigures& l = settings.topology.links;
    l.latency_us = 0;
    l.hop_latency_us = 0;
    l.nvlink_gbs = 7;
    l.inter_node_gbs = 2;
    settings.hbm_bytes_per_second = 1e12;
    const std::vector<double> no_compute(schedule.stacks.size(), 0.0);
    const StepClock clock =
        ClockStep(matrices, schedule, no_compute, n, settings);
    std::vector<int64_t> sizes;
    std::vector<int32_t> owners;
    for (const Transfer& x : schedule.buckets[0].to_owners) {
      sizes.push_back(matrices[x.item.matrix].rows);
      owners.push_back(x.owner);
    }
    const NodeExchange x(plan.exchange_nodes, sizes);
    const auto phase = [&](double e, bool update) {
      // The parts' launch: by rank, bytes in and out.
      std::vector<double> in(n), out(n);
      for (size_t i = 0; i < sizes.size(); ++i) {
        const int node = owners[i] / g;
        for (const ExchangePart& part : x.Parts(i)) {
          if (part.position == owners[i] % g) continue;
          const int from = x.worker(node, part.position);
          out[update ? owners[i] : from] += part.count * e;
          in[update ? from : owners[i]] += part.count * e;
        }
      }
      double parts = 0;
      for (int r = 0; r < n; ++r) {
        parts = std::max(parts, std::max(in[r], out[r]) / 7e9);
      }
      const double block = static_cast<double>(x.block());
      const double hbm =
          2.0 * x.elements() * e + (update ? 0 : 12 * block * (g - 1));
      return block * e * (g - 1) / 7e9 + block * e / 2e9 + parts + hbm / 1e12;
    };
    SCOPED_TRACE(absl::StrCat(m, " nodes of ", g, ", ", count, " matrices"));
    EXPECT_NEAR(clock.gradients_landed_seconds, phase(4, false), 1e-18);
    EXPECT_NEAR(clock.stage_seconds - clock.gradients_landed_seconds,
                phase(2, true), 1e-18);
  }
}

// `owners.size()` unreduced 1024 x 1024 matrices, matrix i owned by rank
// owners[i], one a bucket (4 MiB of fp32 gradients each), on `nodes`
// exchange nodes of `per_node` ranks (in rank order).
struct Exchanged {
  std::vector<MatrixSpec> matrices;
  OwnershipPlan plan;
  StepSchedule schedule;
};

Exchanged MakeExchanged(const std::vector<int32_t>& owners, int nodes,
                        int per_node) {
  Exchanged t;
  for (size_t i = 0; i < owners.size(); ++i) {
    MatrixSpec& m = t.matrices.emplace_back();
    m.name = absl::StrCat("w", i);
    m.rows = 1024;
    m.cols = 1024;
    m.layout = Layout::kUnreduced;
    t.plan.matrix_names.push_back(m.name);
    t.plan.owners.push_back({owners[i]});
  }
  for (int k = 0; k < nodes; ++k) {
    t.plan.exchange_nodes.emplace_back();
    for (int p = 0; p < per_node; ++p) {
      t.plan.worker_ids.push_back(absl::StrCat(k * per_node + p));
      t.plan.exchange_nodes[k].push_back(k * per_node + p);
    }
  }
  t.schedule = *BuildStepSchedule(t.matrices, t.plan,
                                  {.bucket_bytes = int64_t{4} << 20});
  return t;
}

// The exchange's launches in `schedule`, every bucket's exchange `steps`
// steps each way: B + steps - 1 for each sequence of B phases that move
// something (every gradients-to-owners phase; each run of consecutive
// updates-back phases).
int PipelinedLaunches(const StepSchedule& schedule, int steps) {
  int launches = 0, phases = 0;
  const auto close = [&] {
    if (phases > 0) launches += phases + steps - 1;
    phases = 0;
  };
  for (const Phase& p : schedule.order) {
    if (p.kind == PhaseKind::kToOwners &&
        !schedule.buckets[p.index].to_owners.empty()) {
      ++phases;
    }
  }
  close();
  for (const Phase& p : schedule.order) {
    if (p.kind != PhaseKind::kFromOwners) close();
    if (p.kind == PhaseKind::kFromOwners &&
        !schedule.buckets[p.index].from_owners.empty()) {
      ++phases;
    }
  }
  close();
  return launches;
}

TEST(ExchangeClockTest, TheRailLaunchPaysItsHopsAndNoAdds) {
  // One matrix owned by rank 0 on M nodes of 2 and of 1. The rail's launch
  // fills M - 1 hops, the others one each; the rails' reduce adds as it
  // moves, so the HBM time is the pack copies and the adds within the
  // nodes, whatever M. On nodes of 1 the rail is the whole exchange: one
  // launch each way, its bytes over the NICs and only the copies in HBM.
  ClockSettings settings;
  settings.agreement_ms = 0;  // the phases alone
  LinkFigures& l = settings.topology.links;
  l.latency_us = 1;
  l.hop_latency_us = 2;
  l.nvlink_gbs = 100;
  l.inter_node_gbs = 10;
  l.reduce_gbs = 50;  // NVLink only: not the NICs'
  settings.hbm_bytes_per_second = 1e12;
  const double e = 1024.0 * 1024;  // elements
  for (const int m : {2, 3, 5, 8}) {
    SCOPED_TRACE(absl::StrCat(m, " nodes"));
    const double rail = (1 + 2.0 * (m - 1)) * 1e-6;
    {
      const OneExchanged t = MakeOneExchanged(m);
      settings.topology.node = Topology::Blocks(2 * m, 2).node;
      const StepClock clock = ClockStep(
          t.matrices, t.schedule,
          std::vector<double>(t.schedule.stacks.size(), 0.0), 2 * m, settings);
      const double block = e / 2;
      EXPECT_NEAR(clock.gradients_landed_seconds,
                  3e-6 + rail + 3e-6 + block * 4 / 100e9 + block * 4 / 10e9 +
                      block * 4 / 100e9 + (2 * e * 4 + 12 * block) / 1e12,
                  1e-15);
      EXPECT_NEAR(clock.stage_seconds - clock.gradients_landed_seconds,
                  3e-6 + rail + 3e-6 + block * 2 / 100e9 + block * 2 / 10e9 +
                      block * 2 / 100e9 + 2 * e * 2 / 1e12,
                  1e-15);
      EXPECT_NEAR(clock.latency_seconds, 2 * (3e-6 + rail + 3e-6), 1e-15);
      EXPECT_EQ(clock.exchange_launches, 2 * 3);
    }
    const Exchanged t = MakeExchanged({0}, m, 1);
    settings.topology.node = Topology::Blocks(m, 1).node;
    const std::vector<double> no_compute(t.schedule.stacks.size(), 0.0);
    const StepClock clock =
        ClockStep(t.matrices, t.schedule, no_compute, m, settings);
    EXPECT_NEAR(clock.gradients_landed_seconds,
                rail + e * 4 / 10e9 + 2 * e * 4 / 1e12, 1e-15);
    EXPECT_NEAR(clock.stage_seconds - clock.gradients_landed_seconds,
                rail + e * 2 / 10e9 + 2 * e * 2 / 1e12, 1e-15);
    EXPECT_NEAR(clock.latency_seconds, 2 * rail, 1e-15);
    EXPECT_EQ(clock.exchange_launches, 2);
    // Every rank moves the matrix's bytes each way, as on a ring of them.
    EXPECT_EQ(clock.bytes_per_gpu, static_cast<int64_t>(e * (4 + 2)));
    // Rails laid within one host run over NVLink: the gradients' reduce
    // at reduce_gbs, the updates' broadcast at nvlink_gbs.
    ClockSettings one_host = settings;
    one_host.topology.node.clear();
    const StepClock within =
        ClockStep(t.matrices, t.schedule, no_compute, m, one_host);
    EXPECT_NEAR(within.gradients_landed_seconds,
                rail + e * 4 / 50e9 + 2 * e * 4 / 1e12, 1e-15);
    EXPECT_NEAR(within.stage_seconds - within.gradients_landed_seconds,
                rail + e * 2 / 100e9 + 2 * e * 2 / 1e12, 1e-15);
  }
}

TEST(ExchangeClockTest, PipelinesTheBucketsOfASequence) {
  // Six buckets of one matrix each, owned by ranks 0-5 of 4 nodes of 2:
  // each bucket's gradients take 3 steps (within the nodes, along the
  // rails: 3 hops, the parts within the owner's node), the same for every
  // owner. Launch t holds step t - j of bucket j: 6 + 3 - 1 launches, each
  // one latency and its longest ring's hops, the larger of its steps'
  // NVLink and NIC seconds added up, and its steps' HBM seconds (the pack
  // copied before step 0, the adds after it). Bucket j's gradients land
  // when launch j + 2 ends: its owner's stack (no compute) ends then.
  const std::vector<int32_t> owners = {0, 1, 2, 3, 4, 5};
  const int buckets = static_cast<int>(owners.size());
  const Exchanged t = MakeExchanged(owners, 4, 2);
  ASSERT_EQ(t.schedule.buckets.size(), owners.size());
  ClockSettings settings;
  settings.agreement_ms = 0;  // the phases alone
  settings.topology = Topology::Blocks(8, 2);
  LinkFigures& l = settings.topology.links;
  l.latency_us = 1;
  l.hop_latency_us = 2;
  l.nvlink_gbs = 40;
  l.inter_node_gbs = 30;
  settings.hbm_bytes_per_second = 1e12;
  const std::vector<double> no_compute(t.schedule.stacks.size(), 0.0);
  const StepClock clock =
      ClockStep(t.matrices, t.schedule, no_compute, 8, settings);
  const double e = 1024.0 * 1024;  // elements
  const double block = e / 2;
  struct Step {
    int hops = 1;
    double nvlink = 0, nic = 0, hbm = 0;
  };
  // Each member's block along its rail; the owner takes in the other
  // block within its node.
  const std::vector<Step> steps = {
      {1, block * 4 / 40e9, 0, (2 * e * 4 + 12 * block) / 1e12},
      {3, 0, block * 4 / 30e9, 0},
      {1, block * 4 / 40e9, 0, 0}};
  const int last = static_cast<int>(steps.size()) - 1;
  std::vector<double> ends;  // by launch
  double end = 0, latency = 0;
  for (int launch = 0; launch < buckets + last; ++launch) {
    Step sum;
    sum.hops = 0;
    for (int j = 0; j < buckets; ++j) {
      if (launch - j < 0 || launch - j > last) continue;
      const Step& step = steps[launch - j];
      sum.hops = std::max(sum.hops, step.hops);
      sum.nvlink += step.nvlink;
      sum.nic += step.nic;
      sum.hbm += step.hbm;
    }
    latency += (1 + 2 * sum.hops) * 1e-6;
    end += (1 + 2 * sum.hops) * 1e-6 + std::max(sum.nvlink, sum.nic) + sum.hbm;
    ends.push_back(end);
  }
  EXPECT_NEAR(clock.gradients_landed_seconds, end, 1e-15);
  for (int j = 0; j < buckets; ++j) {
    const int32_t owner = t.plan.owners[t.schedule.buckets[j].matrices[0]][0];
    EXPECT_NEAR(clock.worker_compute_end_seconds[owner], ends[j + last], 1e-15)
        << "bucket " << j;
  }
  // A bucket alone takes its steps one after another; the pipeline of six
  // takes less than 0.7 of six of those: the steps of different buckets
  // on NVLink and on the NICs overlap, and share their launches' latency.
  double serial = 0, serial_latency = 0;
  for (const Step& step : steps) {
    serial_latency += (1 + 2 * step.hops) * 1e-6;
    serial += (1 + 2 * step.hops) * 1e-6 + step.nvlink + step.nic + step.hbm;
  }
  const Exchanged one = MakeExchanged({0}, 4, 2);
  const StepClock alone = ClockStep(
      one.matrices, one.schedule,
      std::vector<double>(one.schedule.stacks.size(), 0.0), 8, settings);
  EXPECT_NEAR(alone.gradients_landed_seconds, serial, 1e-15);
  EXPECT_EQ(alone.exchange_launches, 2 * 3);
  EXPECT_LT(clock.gradients_landed_seconds, 0.7 * buckets * serial);
  // Each bucket's updates go back after its own stack, with compute
  // between them: runs of one bucket, each its steps one after another.
  EXPECT_NEAR(clock.stage_seconds - clock.gradients_landed_seconds,
              buckets * (alone.stage_seconds - alone.gradients_landed_seconds),
              1e-15);
  EXPECT_EQ(clock.exchange_launches, (buckets + 2) + buckets * 3);
  EXPECT_EQ(clock.exchange_launches, PipelinedLaunches(t.schedule, 3));
  EXPECT_EQ(clock.phases, 2 * buckets);
  EXPECT_NEAR(clock.latency_seconds, latency + buckets * serial_latency, 1e-15);
  // Without the exchange nodes the same plan's rings clock as before: no
  // launches of a pipeline.
  OwnershipPlan rings = t.plan;
  rings.exchange_nodes.clear();
  const StepSchedule ringed =
      *BuildStepSchedule(t.matrices, rings, {.bucket_bytes = int64_t{4} << 20});
  EXPECT_EQ(
      ClockStep(t.matrices, ringed, no_compute, 8, settings).exchange_launches,
      0);
}

TEST(ExchangeClockTest, PipelinesEachRunOfUpdatesBack) {
  // Eight buckets of one matrix each on nodes of 2 and 1. Owned by ranks
  // 0-7 each bucket's updates go back alone (where there are 8 ranks; else
  // some rank's stack waits for two buckets). All owned by rank 0, its
  // stacks wait for several buckets each, and each run of updates between
  // them is one pipeline. Every sequence takes B + L - 1 launches,
  // L = [G > 1] + 1 + [G > 1]. On nodes of 2 it is shorter than its
  // buckets clocked alone one after another: NVLink and the NICs overlap,
  // launches are saved. On nodes of 1 each bucket's exchange is its rail
  // alone, one launch: the sequence is its buckets one after another.
  struct Case {
    int nodes = 4;
    int per_node = 2;
    int steps = 3;
  };
  for (const Case c : {Case{4, 2, 3}, Case{3, 2, 3}, Case{8, 1, 1},
                       Case{5, 1, 1}, Case{6, 2, 3}}) {
    const int workers = c.nodes * c.per_node;
    ClockSettings settings;
    settings.agreement_ms = 0;  // the phases alone
    settings.topology = Topology::Blocks(workers, c.per_node);
    settings.topology.links.inter_node_gbs = 30;
    settings.topology.links.nvlink_gbs = 40;
    for (const bool one_owner : {false, true}) {
      SCOPED_TRACE(absl::StrCat(c.nodes, " nodes of ", c.per_node,
                                one_owner ? ", one owner" : ""));
      std::vector<int32_t> owners;
      for (int i = 0; i < 8; ++i) owners.push_back(one_owner ? 0 : i % workers);
      const Exchanged t = MakeExchanged(owners, c.nodes, c.per_node);
      ASSERT_EQ(t.schedule.buckets.size(), owners.size());
      const StepClock clock =
          ClockStep(t.matrices, t.schedule,
                    std::vector<double>(t.schedule.stacks.size(), 0.0), workers,
                    settings);
      EXPECT_EQ(clock.exchange_launches,
                PipelinedLaunches(t.schedule, c.steps));
      double gradients = 0, updates = 0;  // each bucket alone
      for (const Phase& p : t.schedule.order) {
        if (p.kind != PhaseKind::kToOwners) continue;
        const int32_t matrix = t.schedule.buckets[p.index].matrices[0];
        const Exchanged one =
            MakeExchanged({owners[matrix]}, c.nodes, c.per_node);
        const StepClock alone =
            ClockStep(one.matrices, one.schedule,
                      std::vector<double>(one.schedule.stacks.size(), 0.0),
                      workers, settings);
        EXPECT_EQ(alone.exchange_launches, 2 * c.steps);
        gradients += alone.gradients_landed_seconds;
        updates += alone.stage_seconds - alone.gradients_landed_seconds;
      }
      const double back = clock.stage_seconds - clock.gradients_landed_seconds;
      if (c.per_node == 1) {
        EXPECT_NEAR(clock.gradients_landed_seconds, gradients, 1e-15);
        EXPECT_NEAR(back, updates, 1e-15);
        continue;
      }
      EXPECT_LT(clock.gradients_landed_seconds, 0.8 * gradients);
      if (!one_owner && workers >= 8) {
        EXPECT_NEAR(back, updates, 1e-15);
      } else {
        // Some run of updates holds several buckets.
        EXPECT_LT(clock.exchange_launches, 8 + c.steps - 1 + 8 * c.steps);
        EXPECT_LT(back, (one_owner ? 0.9 : 0.999) * updates);
      }
    }
  }
}

TEST(ExchangeClockTest, OtherTransfersGoInTheLaunchOfStepZero) {
  // One bucket of an unreduced matrix owned by rank 0 and a replicated one
  // owned by rank 1, on 4 nodes of 2. Its updates: the replicated one's
  // broadcast (a message and 7 ring hops; half its bytes over NVLink and
  // half over each NIC, 2 to a node) goes in one launch with the
  // exchange's first step (the parts from the owner to the other position
  // of its node, over NVLink): their NVLink seconds add, the NICs carry
  // the broadcast's alone. Then the rails' broadcast (3 hops) and the
  // blocks within the nodes.
  std::vector<MatrixSpec> matrices(2);
  OwnershipPlan plan;
  for (int i = 0; i < 2; ++i) {
    matrices[i].name = absl::StrCat("w", i);
    matrices[i].rows = 1024;
    matrices[i].cols = 1024;
    matrices[i].layout = i == 0 ? Layout::kUnreduced : Layout::kReplicated;
    plan.matrix_names.push_back(matrices[i].name);
    plan.owners.push_back({i});
  }
  for (int k = 0; k < 4; ++k) {
    plan.exchange_nodes.push_back({2 * k, 2 * k + 1});
    plan.worker_ids.push_back(absl::StrCat(2 * k));
    plan.worker_ids.push_back(absl::StrCat(2 * k + 1));
  }
  const StepSchedule schedule = *BuildStepSchedule(matrices, plan);
  ASSERT_EQ(schedule.buckets.size(), 1u);
  ASSERT_EQ(schedule.buckets[0].from_owners.size(), 2u);
  ClockSettings settings;
  settings.topology = Topology::Blocks(8, 2);
  LinkFigures& l = settings.topology.links;
  l.latency_us = 1;
  l.hop_latency_us = 2;
  l.nvlink_gbs = 40;
  l.inter_node_gbs = 30;
  settings.hbm_bytes_per_second = 1e12;
  const std::vector<double> no_compute(schedule.stacks.size(), 0.0);
  const StepClock clock =
      ClockStep(matrices, schedule, no_compute, 8, settings);
  const double e = 1024.0 * 1024;  // elements; bf16 updates: 2e bytes
  const double first =
      (1 + 7 * 2 + 3) * 1e-6 + std::max((e + e) / 40e9, e / 30e9);
  const double rest = (7 + 3) * 1e-6 + e / 30e9 + e / 40e9 + 2 * e * 2 / 1e12;
  EXPECT_NEAR(clock.stage_seconds - clock.gradients_landed_seconds,
              first + rest, 1e-15);
  EXPECT_EQ(clock.exchange_launches, 2 * 3);
  EXPECT_EQ(clock.phases, 2);
  EXPECT_NEAR(clock.latency_seconds, (2 * (3 + 7 + 3) + 1 + 7 * 2) * 1e-6,
              1e-15);
}

TEST(ExchangeClockTest, ABucketWithoutTheExchangeTakesOneLaunch) {
  // An unreduced matrix owned by rank 0, then (a layer below, a bucket of
  // its own) a row-sharded one owned by rank 1, on 4 nodes of 2. The
  // gradients: the second bucket's row gather (a message; its owner takes
  // in a member's rows over NVLink and three over its NIC, from the ranks
  // at its position; the other three cross to their relay, rank 0) goes in
  // launch 1 with the first bucket's rails (3 hops, a block over each NIC),
  // followed by the relay's second launch (a message, three ranks' rows
  // over NVLink), and has landed when that ends; the first bucket's
  // exchange when launch 2 does. 3 launches for the gradients, then 3 and
  // 1 for the updates, each bucket's after its own stack.
  std::vector<MatrixSpec> matrices(2);
  OwnershipPlan plan;
  for (int i = 0; i < 2; ++i) {
    matrices[i].name = absl::StrCat("w", i);
    matrices[i].rows = 1024;
    matrices[i].cols = 1024;
    matrices[i].layer = 1 - i;
    matrices[i].layout = i == 0 ? Layout::kUnreduced : Layout::kRowSharded;
    plan.matrix_names.push_back(matrices[i].name);
    plan.owners.push_back({i});
  }
  for (int k = 0; k < 4; ++k) {
    plan.exchange_nodes.push_back({2 * k, 2 * k + 1});
    plan.worker_ids.push_back(absl::StrCat(2 * k));
    plan.worker_ids.push_back(absl::StrCat(2 * k + 1));
  }
  const StepSchedule schedule =
      *BuildStepSchedule(matrices, plan, {.bucket_bytes = int64_t{4} << 20});
  ASSERT_EQ(schedule.buckets.size(), 2u);
  ASSERT_EQ(schedule.order[0].kind, PhaseKind::kToOwners);
  ASSERT_EQ(schedule.buckets[schedule.order[0].index].matrices,
            std::vector<int32_t>{0});
  ClockSettings settings;
  settings.agreement_ms = 0;  // the phases alone
  settings.topology = Topology::Blocks(8, 2);
  LinkFigures& l = settings.topology.links;
  l.latency_us = 1;
  l.hop_latency_us = 2;
  l.nvlink_gbs = 40;
  l.inter_node_gbs = 30;
  settings.hbm_bytes_per_second = 1e12;
  const std::vector<double> no_compute(schedule.stacks.size(), 0.0);
  const StepClock clock =
      ClockStep(matrices, schedule, no_compute, 8, settings);
  const double e = 1024.0 * 1024;  // elements; fp32 gradients: 4e bytes
  const double launches[] = {
      3e-6 + e * 2 / 40e9 + (2 * e * 4 + 12 * e / 2) / 1e12,
      (1 + 7) * 1e-6 + std::max(e / 2 / 40e9, 1.5 * e / 30e9 + e * 2 / 30e9) +
          1e-6 + 1.5 * e / 40e9,
      3e-6 + e * 2 / 40e9};
  EXPECT_NEAR(clock.worker_compute_end_seconds[1], launches[0] + launches[1],
              1e-15);
  double gradients = 0;
  for (const double seconds : launches) gradients += seconds;
  EXPECT_NEAR(clock.gradients_landed_seconds, gradients, 1e-15);
  EXPECT_NEAR(clock.worker_compute_end_seconds[0], gradients, 1e-15);
  EXPECT_EQ(clock.exchange_launches, 3 + 3 + 1);
  EXPECT_EQ(clock.phases, 4);
}

TEST(ExchangeClockTest, FewerHopsThanTheRingsAcrossManyNodes) {
  // 1024 ranks in 128 nodes of 8, one bucket of a layer's seven matrices:
  // a ring per matrix pays a message each and 1023 hops a phase; the
  // exchange 3 launches, of one hop within the nodes and 127 along the
  // rails.
  Job job = Plan(1024, Layout::kUnreduced, 1);
  ClockSettings settings;
  settings.topology = Topology::Blocks(1024, 8);
  const LinkFigures& l = settings.topology.links;
  const ScheduleOptions one_bucket = {.bucket_bytes = int64_t{1} << 40};
  const StepSchedule rings =
      *BuildStepSchedule(job.matrices, job.plan, one_bucket);
  job.plan.exchange_nodes = ChooseExchangeNodes(job.matrices, settings.topology,
                                                1024, /*dedicated=*/0);
  ASSERT_EQ(job.plan.exchange_nodes.size(), 128u);
  const StepSchedule exchange =
      *BuildStepSchedule(job.matrices, job.plan, one_bucket);
  const StepClock by_rings = ClockStep(
      job.matrices, rings,
      StackSeconds(job.matrices, rings, job.models, settings), 1024, settings);
  const StepClock by_exchange =
      ClockStep(job.matrices, exchange,
                StackSeconds(job.matrices, exchange, job.models, settings),
                1024, settings);
  EXPECT_EQ(by_rings.phases, 2);
  EXPECT_EQ(by_exchange.phases, 2);
  EXPECT_EQ(by_exchange.exchange_launches, 2 * 3);
  EXPECT_NEAR(by_rings.latency_seconds,
              2 * (7 * l.latency_us + 1023 * l.hop_latency_us) * 1e-6, 1e-12);
  EXPECT_NEAR(by_exchange.latency_seconds,
              2 * (3 * l.latency_us + (1 + 127 + 1) * l.hop_latency_us) * 1e-6,
              1e-12);
  EXPECT_LT(7 * by_exchange.latency_seconds, by_rings.latency_seconds);
  // Each GPU's bytes are of the same order: the levels carry about what
  // the rings do, the parts add one matrix at its owner.
  EXPECT_GT(by_exchange.bytes_per_gpu, by_rings.bytes_per_gpu / 2);
  EXPECT_LT(by_exchange.bytes_per_gpu, 3 * by_rings.bytes_per_gpu);
}

TEST(ChooseExchangeNodesTest,
     EqualNodesOfJobsWithUnreducedOrRowShardedMatrices) {
  std::vector<MatrixSpec> matrices = Llama3_8B(1);
  // Node k by number, its ranks in rank order.
  const Topology shuffled{{1, 0, 1, 0}, {}};
  EXPECT_EQ(ChooseExchangeNodes(matrices, shuffled, 4, 0),
            (std::vector<std::vector<int32_t>>{{1, 3}, {0, 2}}));
  EXPECT_THAT(ChooseExchangeNodes(matrices, Topology::Blocks(4, 4), 4, 0),
              IsEmpty());
  EXPECT_THAT(ChooseExchangeNodes(matrices, Topology::Blocks(3, 2), 3, 0),
              IsEmpty());
  EXPECT_THAT(ChooseExchangeNodes(matrices, Topology::Blocks(4, 2), 4, 1),
              IsEmpty());
  EXPECT_THAT(ChooseExchangeNodes(matrices, Topology{}, 4, 0), IsEmpty());
  matrices[0].layout = Layout::kReplicated;
  EXPECT_THAT(ChooseExchangeNodes(matrices, Topology::Blocks(4, 2), 4, 0),
              Not(IsEmpty()));
  // Rows sharded by rows go through relays; whole experts and replicated
  // gradients change nothing.
  for (MatrixSpec& m : matrices) m.layout = Layout::kRowSharded;
  EXPECT_THAT(ChooseExchangeNodes(matrices, Topology::Blocks(4, 2), 4, 0),
              Not(IsEmpty()));
  for (MatrixSpec& m : matrices) m.shard_experts = true;
  EXPECT_THAT(ChooseExchangeNodes(matrices, Topology::Blocks(4, 2), 4, 0),
              IsEmpty());
  for (MatrixSpec& m : matrices) m.layout = Layout::kReplicated;
  EXPECT_THAT(ChooseExchangeNodes(matrices, Topology::Blocks(4, 2), 4, 0),
              IsEmpty());
}

TEST(PlanOnTopologyTest, TakesTheExchangeWhereItsStepIsShorter) {
  // Two layers on 2 nodes of 8. The exchange pays 3 hops a phase (one a
  // launch: its rails' rings have one each) where a ring pays 15, but
  // spends HBM time on its adds and copies, and its parts within the
  // owner's node add to its NVLink bytes: with NCCL's hop latency the
  // rings win; with HBM at 1/43 of an H200's (0.1 TB/s) so clearly that
  // the exchange's least step says so; with a hop of 1 ms the exchange
  // wins. On 2 nodes of 2 a ring pays as many hops (3) as the exchange's
  // launches do: the rings win either way, with NCCL's hop latency so
  // clearly that the exchange's least step says so. Each time the plan is
  // made once: only its schedule differs.
  struct Case {
    int per_node = 8;
    double hop_us = 3.4;
    double hbm = 4.3e12;
    bool exchange = false;
    bool passed_over = false;  // by the exchange's least step
  };
  for (const Case c :
       {Case{8, 3.4, 4.3e12, false, false}, Case{8, 3.4, 1e11, false, true},
        Case{8, 1000, 4.3e12, true, false}, Case{2, 3.4, 4.3e12, false, true},
        Case{2, 1000, 4.3e12, false, false}}) {
    SCOPED_TRACE(absl::StrCat("2 nodes of ", c.per_node, ", hop ", c.hop_us,
                              ", HBM ", c.hbm));
    const int workers = 2 * c.per_node;
    const Job job = Plan(workers, Layout::kUnreduced, 2);
    ClockSettings settings;
    settings.topology = Topology::Blocks(workers, c.per_node);
    settings.topology.links.hop_latency_us = c.hop_us;
    settings.hbm_bytes_per_second = c.hbm;
    settings.apply_early = true;
    int planned = 0;
    const absl::StatusOr<TopologyPlan> out = PlanOnTopology(
        job.matrices, job.plan.worker_ids, 0, job.models, settings,
        {.bucket_bytes = 0}, {}, OwnerGroupsUse::kWeighed,
        [&](const std::vector<int32_t>&, const OwnerGrouping*, bool) {
          ++planned;
          return absl::StatusOr<OwnershipPlan>(job.plan);
        });
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(planned, 1);
    EXPECT_TRUE(out->weighed.exchange_offered);
    EXPECT_EQ(out->weighed.exchange_passed_over, c.passed_over);
    EXPECT_GT(out->weighed.rings_seconds, 0);
    // The exchange's step, or (passed over) its least, below it.
    OwnershipPlan with = job.plan;
    with.exchange_nodes = ChooseExchangeNodes(job.matrices, settings.topology,
                                              workers, /*dedicated=*/0);
    const double exchange_step =
        ChooseStepGrouping(job.matrices, with, job.models, settings)
            ->predicted_seconds;
    if (c.passed_over) {
      EXPECT_GE(out->weighed.exchange_seconds, out->weighed.rings_seconds);
      EXPECT_LE(out->weighed.exchange_seconds, exchange_step);
    } else {
      EXPECT_DOUBLE_EQ(out->weighed.exchange_seconds, exchange_step);
    }
    const bool exchange = c.exchange;
    EXPECT_EQ(out->weighed.exchange_seconds < out->weighed.rings_seconds,
              exchange);
    EXPECT_EQ(out->plan.exchange_nodes.empty(), !exchange);
    EXPECT_EQ(out->grouping.schedule.exchange_nodes, out->plan.exchange_nodes);
    const Transfer& first = out->grouping.schedule.buckets[0].to_owners[0];
    EXPECT_EQ(first.kind, exchange ? TransferKind::kExchangeToOwner
                                   : TransferKind::kReduceToOwner);
    // The taken schedule's clock, its applies weighed from it.
    const double taken =
        exchange ? out->weighed.exchange_seconds : out->weighed.rings_seconds;
    EXPECT_DOUBLE_EQ(out->grouping.predicted_seconds, taken);
    EXPECT_DOUBLE_EQ(std::min(out->weighed.before_votes_seconds,
                              out->weighed.at_commit_seconds),
                     taken);
    const StepClock clock =
        ClockStep(job.matrices, out->grouping.schedule,
                  StackSeconds(job.matrices, out->grouping.schedule, job.models,
                               settings),
                  workers, settings);
    EXPECT_DOUBLE_EQ(clock.predicted_seconds, taken);
  }
}

TEST(PlanOnTopologyTest, NoExchangeOnOneNodeOrForReplicatedMatrices) {
  for (const Layout layout :
       {Layout::kUnreduced, Layout::kRowSharded, Layout::kReplicated}) {
    const Job job = Plan(8, layout, 1);
    for (const int per_node : {8, 4}) {
      ClockSettings settings;
      settings.topology = Topology::Blocks(8, per_node);
      const absl::StatusOr<TopologyPlan> out = OnTopology(job, settings);
      ASSERT_TRUE(out.ok()) << out.status();
      const bool offered = layout != Layout::kReplicated && per_node == 4;
      EXPECT_EQ(out->weighed.exchange_offered, offered) << per_node;
      if (!offered) {
        EXPECT_THAT(out->plan.exchange_nodes, IsEmpty());
        EXPECT_EQ(out->weighed.exchange_seconds, 0);
      }
    }
  }
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
