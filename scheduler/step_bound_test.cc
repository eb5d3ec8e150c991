#include "scheduler/step_bound.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/model_shapes.h"
#include "scheduler/planner.h"
#include "scheduler/step_clock.h"

namespace muonps {
namespace scheduler {
namespace {

using ::testing::Contains;
using ::testing::Not;
using ::testing::Pair;

// `count` random matrices, all replicated, and `workers` workers of 140 GiB
// on nodes of 8, with one cost model.
struct Job {
  std::vector<MatrixSpec> matrices;
  std::vector<WorkerSpec> workers;
  CostModel model{nullptr, DeviceRates{}, 1.0, 5};
  std::vector<const CostModel*> models;
  ClockSettings settings;
};

Job Replicated(int count, int workers) {
  Job job;
  job.matrices = RandomShapes(count, 7);
  for (MatrixSpec& m : job.matrices) m.layout = Layout::kReplicated;
  for (int w = 0; w < workers; ++w) {
    WorkerSpec spec;
    spec.id = "w" + std::to_string(w);
    spec.memory_bytes = int64_t{140} << 30;
    job.workers.push_back(spec);
  }
  job.models.assign(workers, &job.model);
  job.settings.topology = Topology::Blocks(workers, 8);
  return job;
}

// The plan of `ranks` alone and the step ChooseStepGrouping predicts for
// it on their nodes, cut as `options` says; with `exchange`, the plan's
// exchange nodes are those nodes (ranks of one node in order).
struct Alone {
  OwnershipPlan plan;
  double predicted_seconds = 0;
};

Alone PlanAlone(const Job& job, const std::vector<int32_t>& ranks,
                const ScheduleOptions& options, bool exchange = false) {
  PlanInput input{job.matrices, {}, {}};
  ClockSettings alone = job.settings;
  alone.topology.node.clear();
  std::vector<const CostModel*> models;
  for (const int32_t r : ranks) {
    input.workers.push_back(job.workers[r]);
    alone.topology.node.push_back(job.settings.topology.node[r]);
    models.push_back(job.models[r]);
  }
  Alone out;
  out.plan = *PlanOwnership(input);
  if (exchange) {
    for (size_t p = 0; p < ranks.size(); ++p) {
      const int32_t node = alone.topology.node[p];
      if (p == 0 || node != alone.topology.node[p - 1]) {
        out.plan.exchange_nodes.emplace_back();
      }
      out.plan.exchange_nodes.back().push_back(static_cast<int32_t>(p));
    }
  }
  const StepGrouping g =
      *ChooseStepGrouping(job.matrices, out.plan, models, alone, options);
  out.predicted_seconds =
      g.predicted_seconds > 0
          ? g.predicted_seconds
          : ClockStep(job.matrices, g.schedule,
                      StackSeconds(job.matrices, g.schedule, models, alone),
                      static_cast<int>(ranks.size()), alone)
                .predicted_seconds;
  return out;
}

std::vector<int32_t> FirstRanks(int count) {
  std::vector<int32_t> ranks(count);
  for (int r = 0; r < count; ++r) ranks[r] = r;
  return ranks;
}

// With the updates applied at the commit, and where the clock may apply
// them before the votes (owner groups of replicated matrices may).
TEST(StepBoundTest, StaysBelowThePredictedStepOfEveryPlanAcrossNodes) {
  Job job = Replicated(3000, 64);
  for (const bool apply_early : {false, true}) {
    job.settings.apply_early = apply_early;
    for (const ScheduleOptions options :
         {ScheduleOptions{.bucket_bytes = 0},
          ScheduleOptions{.bucket_bytes = int64_t{256} << 20}}) {
      const StepBound bound(job.matrices, job.settings, options, 0);
      for (const int workers : {16, 32, 64}) {
        const std::vector<int32_t> ranks = FirstRanks(workers);
        const Alone alone = PlanAlone(job, ranks, options);
        const double with_compute =
            bound.Seconds(ranks, alone.plan.work_seconds / workers);
        // The transfers and the commit are the clock's own; only the
        // compute overlapping them is left out (and, before the votes,
        // where each bucket lands among the applies).
        EXPECT_LE(with_compute, alone.predicted_seconds)
            << workers << " apply_early " << apply_early;
        EXPECT_GT(with_compute,
                  (apply_early ? 0.85 : 0.9) * alone.predicted_seconds)
            << workers << " apply_early " << apply_early;
        EXPECT_LE(bound.Seconds(ranks, 0), with_compute) << workers;
        // Exchange nodes carry no replicated matrix: the same step.
        const Alone exchange = PlanAlone(job, ranks, options, true);
        ASSERT_EQ(exchange.plan.exchange_nodes.size(), workers / 8u);
        EXPECT_DOUBLE_EQ(exchange.predicted_seconds, alone.predicted_seconds)
            << workers;
        EXPECT_LE(with_compute, exchange.predicted_seconds) << workers;
      }
    }
  }
}

TEST(StepBoundTest, NoneBelowAnExchangePlanOfUnreducedMatrices) {
  // Some matrices unreduced: their transfers depend on the plan (rings or
  // the exchange), so there is no bound, and it never exceeds either step.
  Job job = Replicated(600, 32);
  for (size_t m = 0; m < job.matrices.size(); m += 3) {
    job.matrices[m].layout = Layout::kUnreduced;
  }
  for (const bool apply_early : {false, true}) {
    job.settings.apply_early = apply_early;
    const StepBound bound(job.matrices, job.settings, {}, 0);
    const std::vector<int32_t> ranks = FirstRanks(32);
    const Alone rings = PlanAlone(job, ranks, {.bucket_bytes = 0});
    const Alone exchange = PlanAlone(job, ranks, {.bucket_bytes = 0}, true);
    ASSERT_EQ(exchange.plan.exchange_nodes.size(), 4u);
    EXPECT_GT(exchange.predicted_seconds, 0);
    EXPECT_NE(exchange.predicted_seconds, rings.predicted_seconds);
    EXPECT_THAT(bound.CutSeconds(ranks, exchange.plan.work_seconds / 32),
                ::testing::IsEmpty());
    EXPECT_LE(bound.Seconds(ranks, exchange.plan.work_seconds / 32),
              std::min(rings.predicted_seconds, exchange.predicted_seconds));
  }
}

TEST(StepBoundTest, ExchangeBoundStaysBelowEveryCutOfEveryPlan) {
  // Unreduced (and some replicated and row-sharded) matrices on nodes of
  // 8, 2 and 1, 2 to 8 of them, with NCCL's hop latency and with hops of
  // a millisecond (the rails' M - 1 hops weigh): the exchange's least step
  // is below the clock of every bucket bound, down to buckets of 16 MiB,
  // whose sequences pipeline many buckets' steps.
  for (const auto& [workers, per_node, hop_us] :
       std::vector<std::tuple<int, int, double>>{{16, 8, 3.4},
                                                 {24, 8, 3.4},
                                                 {6, 2, 3.4},
                                                 {5, 1, 3.4},
                                                 {64, 8, 3.4},
                                                 {40, 8, 3.4},
                                                 {64, 8, 1000},
                                                 {6, 2, 1000},
                                                 {5, 1, 1000}}) {
    Job job = Replicated(400, workers);
    job.settings.topology = Topology::Blocks(workers, per_node);
    job.settings.topology.links.hop_latency_us = hop_us;
    for (size_t m = 0; m < job.matrices.size(); ++m) {
      job.matrices[m].layout = m % 5 == 0   ? Layout::kReplicated
                               : m % 7 == 0 ? Layout::kRowSharded
                                            : Layout::kUnreduced;
    }
    PlanInput input{job.matrices, job.workers, {}};
    OwnershipPlan plan = *PlanOwnership(input);
    plan.exchange_nodes = ChooseExchangeNodes(
        job.matrices, job.settings.topology, workers, /*dedicated=*/0);
    ASSERT_EQ(plan.exchange_nodes.size(),
              static_cast<size_t>(workers / per_node));
    for (const bool apply_early : {false, true}) {
      job.settings.apply_early = apply_early;
      const double least = ExchangeStepBound(
          job.matrices, workers, workers / per_node, per_node, job.settings);
      EXPECT_GT(least, 0);
      std::vector<int64_t> bounds = BucketBoundsTried(job.matrices);
      bounds.push_back(int64_t{16} << 20);
      for (const int64_t bound : bounds) {
        const StepSchedule schedule =
            *BuildStepSchedule(job.matrices, plan, {.bucket_bytes = bound});
        const StepClock clock = ClockStep(
            job.matrices, schedule,
            StackSeconds(job.matrices, schedule, job.models, job.settings),
            workers, job.settings);
        EXPECT_LE(least, clock.predicted_seconds)
            << workers << " on nodes of " << per_node << ", hop " << hop_us
            << ", bucket " << bound << ", apply_early " << apply_early;
        if (bound == bounds.back()) {
          // Each way at least one sequence of many buckets.
          EXPECT_GT(schedule.buckets.size(), 100u);
          EXPECT_GT(clock.exchange_launches, 2 * 100);
        }
      }
    }
  }
  // No unreduced matrix: nothing moves by the exchange.
  Job job = Replicated(10, 16);
  EXPECT_EQ(ExchangeStepBound(job.matrices, 16, 2, 8, job.settings), 0);
}

TEST(StepBoundTest, ExchangeStepsAreTheLevelsRailsAndParts) {
  // M nodes of G, a pack of 2^20 elements (1000 of them the items'):
  // gradients within the nodes (the adds after), along the rails (M - 1
  // hops, a block each way over each NIC, no adds), the parts; updates the
  // reverse, the copies out of the pack after the last.
  ClockSettings settings;
  settings.hbm_bytes_per_second = 1e12;
  const double packed = 1 << 20;
  for (const int g : {1, 2, 8}) {
    const double block = packed / g;
    const std::vector<ExchangeStep> gradients =
        ExchangeStepsOf(5, g, 1000, packed, false, settings);
    const std::vector<ExchangeStep> updates =
        ExchangeStepsOf(5, g, 1000, packed, true, settings);
    ASSERT_EQ(gradients.size(), g > 1 ? 3u : 1u) << g;
    ASSERT_EQ(updates.size(), gradients.size()) << g;
    const ExchangeStep& rail = gradients[g > 1 ? 1 : 0];
    EXPECT_TRUE(rail.across);
    EXPECT_TRUE(rail.reduce);
    EXPECT_EQ(rail.hops, 4);
    EXPECT_DOUBLE_EQ(rail.bytes, block * 4);
    EXPECT_EQ(rail.hbm_after_seconds, 0);
    EXPECT_DOUBLE_EQ(gradients.front().hbm_before_seconds, 2 * 1000 * 4 / 1e12);
    EXPECT_DOUBLE_EQ(updates.back().hbm_after_seconds, 2 * 1000 * 2 / 1e12);
    const ExchangeStep& back = updates[g > 1 ? 1 : 0];
    EXPECT_TRUE(back.across);
    EXPECT_FALSE(back.reduce);
    EXPECT_EQ(back.hops, 4);
    EXPECT_DOUBLE_EQ(back.bytes, block * 2);
    if (g == 1) continue;
    EXPECT_FALSE(gradients[0].across);
    EXPECT_EQ(gradients[0].hops, 1);
    EXPECT_DOUBLE_EQ(gradients[0].bytes, block * 4 * (g - 1));
    EXPECT_DOUBLE_EQ(gradients[0].hbm_after_seconds,
                     12 * block * (g - 1) / 1e12);
    EXPECT_TRUE(gradients[2].parts);
    EXPECT_TRUE(updates[0].parts);
    EXPECT_DOUBLE_EQ(updates[2].bytes, block * 2 * (g - 1));
  }
  // One node: no rail.
  EXPECT_EQ(ExchangeStepsOf(1, 8, 1000, packed, false, settings).size(), 2u);
}

TEST(StepBoundTest, ExchangeBoundPaysTheRailsHops) {
  // Each way every step's launch: latency_us and its hops, M - 1 for the
  // rails: the bound grows by 2 ((M - 1) + 2) hops on nodes of 8, by
  // 2 (M - 1) on nodes of 1.
  Job job = Replicated(50, 64);
  for (MatrixSpec& m : job.matrices) m.layout = Layout::kUnreduced;
  for (const auto& [nodes, per_node] :
       std::vector<std::pair<int, int>>{{8, 8}, {2, 8}, {16, 1}}) {
    ClockSettings settings = job.settings;
    settings.topology = Topology::Blocks(nodes * per_node, per_node);
    settings.topology.links.hop_latency_us = 0;
    const double base = ExchangeStepBound(job.matrices, nodes * per_node, nodes,
                                          per_node, settings);
    settings.topology.links.hop_latency_us = 1000;
    const double with_hops = ExchangeStepBound(job.matrices, nodes * per_node,
                                               nodes, per_node, settings);
    const double hops = 2.0 * ((nodes - 1) + (per_node > 1 ? 2 : 0));
    EXPECT_NEAR(with_hops - base, hops * 1e-3, 1e-9) << nodes;
  }
}

TEST(StepBoundTest, NoneWhereTransfersDependOnThePlanOrStayOnOneNode) {
  Job job = Replicated(100, 16);
  EXPECT_GT(
      StepBound(job.matrices, job.settings, {}, 0).Seconds(FirstRanks(16), 0),
      0);
  // One node: peer writes, not rings.
  EXPECT_EQ(
      StepBound(job.matrices, job.settings, {}, 0).Seconds(FirstRanks(8), 0),
      0);
  // A dedicated worker receives gradients.
  EXPECT_EQ(
      StepBound(job.matrices, job.settings, {}, 1).Seconds(FirstRanks(16), 0),
      0);
  // Unreduced gradients move to their owners.
  job.matrices[0].layout = Layout::kUnreduced;
  EXPECT_EQ(
      StepBound(job.matrices, job.settings, {}, 0).Seconds(FirstRanks(16), 0),
      0);
}

TEST(StepBoundTest, PlanOnTopologyPassesOverAGroupingThatCannotWin) {
  // 8 nodes of 8. Groups of 4 nodes move the same bytes a port as the plan
  // of every worker and compute twice as much each, so they are passed over
  // unplanned; the plan is the one of every worker, as when they were
  // planned (their own step is longer). One node cannot hold the momentum.
  Job job = Replicated(20000, 64);
  // Slow ring hops: many buckets cost every ring's fill over and over, so
  // one bucket of everything is best, after all compute.
  job.settings.topology.links.hop_latency_us = 200;
  const std::vector<OwnerGrouping> offered = ChooseOwnerGroupings(
      job.matrices, job.settings.topology, 64, /*dedicated=*/0);
  ASSERT_EQ(offered.size(), 3u);  // groups of 1, 2 and 4 nodes
  std::vector<std::string> ids;
  for (const WorkerSpec& w : job.workers) ids.push_back(w.id);
  std::vector<int> planned;  // workers of each plan made
  std::mutex mu;
  const absl::StatusOr<TopologyPlan> out = PlanOnTopology(
      job.matrices, ids, 0, job.models, job.settings, {.bucket_bytes = 0},
      offered, OwnerGroupsUse::kWeighed,
      [&](const std::vector<int32_t>& ranks, const OwnerGrouping*, bool) {
        {
          std::lock_guard<std::mutex> lock(mu);
          planned.push_back(static_cast<int>(ranks.size()));
        }
        PlanInput input{job.matrices, {}, {}};
        for (const int32_t r : ranks) input.workers.push_back(job.workers[r]);
        return PlanOwnership(input);
      });
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(planned, Not(Contains(32)));
  EXPECT_THAT(out->weighed.grouped_candidates, Contains(Pair(32, 0.0)));
  EXPECT_TRUE(out->plan.groups.empty());
  PlanInput every{job.matrices, job.workers, {}};
  EXPECT_EQ(out->plan.max_seconds, PlanOwnership(every)->max_seconds);
  const Alone two_nodes = PlanAlone(job, FirstRanks(32), {.bucket_bytes = 0});
  EXPECT_GT(two_nodes.predicted_seconds, out->weighed.ungrouped_seconds);
}

TEST(StepBoundTest, PlanOnTopologyPassesOverThePlanOfEveryWorkerThatCannotWin) {
  // 8 nodes of 8 on a slow network, the updates applied before the votes:
  // groups of one node, planned first beside the plan of every worker,
  // predict a shorter step than that plan's least, so it is not made; the
  // grouped plan is the one taken when both were made.
  Job job = Replicated(2000, 64);
  job.settings.topology.links.inter_node_gbs = 1;
  job.settings.apply_early = true;
  const std::vector<OwnerGrouping> offered = ChooseOwnerGroupings(
      job.matrices, job.settings.topology, 64, /*dedicated=*/0);
  std::vector<std::string> ids;
  for (const WorkerSpec& w : job.workers) ids.push_back(w.id);
  std::vector<int> planned;
  std::mutex mu;
  const PlanRanks plan_ranks = [&](const std::vector<int32_t>& ranks,
                                   const OwnerGrouping*, bool) {
    {
      std::lock_guard<std::mutex> lock(mu);
      planned.push_back(static_cast<int>(ranks.size()));
    }
    PlanInput input{job.matrices, {}, {}};
    for (const int32_t r : ranks) input.workers.push_back(job.workers[r]);
    return PlanOwnership(input);
  };
  const absl::StatusOr<TopologyPlan> out = PlanOnTopology(
      job.matrices, ids, 0, job.models, job.settings, {.bucket_bytes = 0},
      offered, OwnerGroupsUse::kWeighed, plan_ranks);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_THAT(planned, Not(Contains(64)));
  EXPECT_TRUE(out->weighed.ungrouped_passed_over);
  ASSERT_FALSE(out->plan.groups.empty());
  EXPECT_LE(out->weighed.grouped_seconds, out->weighed.ungrouped_seconds);
  // The plan of every worker, made: no shorter than the bound said.
  const absl::StatusOr<TopologyPlan> every = PlanOnTopology(
      job.matrices, ids, 0, job.models, job.settings, {.bucket_bytes = 0}, {},
      OwnerGroupsUse::kWeighed, plan_ranks);
  ASSERT_TRUE(every.ok()) << every.status();
  EXPECT_GE(every->grouping.predicted_seconds, out->weighed.ungrouped_seconds);
  EXPECT_EQ(out->plan.groups.size(), offered[0].size());
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
