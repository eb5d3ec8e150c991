#include "bench/scale_sim/scale_sim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/cost_table.h"
#include "server/worker/step_control.h"

namespace muonps {
namespace bench {
namespace {

using scheduler::Layout;
using ::testing::HasSubstr;

// Llama-3-8B shapes at batch 1, 4 and 16, after the H200 table's NS5 and
// Gram curves (bench/results/2026-11-23-h200-cost-table.jsonl).
std::shared_ptr<const scheduler::CostTable> LlamaCosts() {
  auto table = std::make_shared<scheduler::CostTable>();
  const struct {
    int64_t rows, cols;
    NsAlgorithm algorithm;
    double b1, b4, b16;
  } curves[] = {
      {1024, 4096, NsAlgorithm::kGram, 0.000306, 0.000755, 0.00244},
      {4096, 4096, NsAlgorithm::kNs5, 0.00267, 0.0102, 0.0428},
      {4096, 14336, NsAlgorithm::kGram, 0.00486, 0.0196, 0.0782},
  };
  for (const auto& c : curves) {
    EXPECT_TRUE(table->Add(c.rows, c.cols, c.algorithm, 1, c.b1).ok());
    EXPECT_TRUE(table->Add(c.rows, c.cols, c.algorithm, 4, c.b4).ok());
    EXPECT_TRUE(table->Add(c.rows, c.cols, c.algorithm, 16, c.b16).ok());
  }
  return table;
}

// The step's data path: its control rounds' messages, which grow with the
// ranks, have tests of their own (ControlMessagesThroughAStarGrowWithTheRanks,
// ControlMessagesAlongATreeGrowWithItsDepth).
SimConfig Config(const std::string& model, int gpus,
                 Layout layout = Layout::kUnreduced) {
  SimConfig c;
  c.model = model;
  c.matrices = *ModelMatrices(model, layout);
  c.gpus = gpus;
  c.costs = LlamaCosts();
  c.control_message_us = 0;
  return c;
}

// Two tiny matrices whose transfers are easy to count by hand.
SimConfig Tiny(int gpus, int per_node, Layout layout, int matrices = 2) {
  SimConfig c;
  c.model = "tiny";
  for (int m = 0; m < matrices; ++m) {
    scheduler::MatrixSpec spec;
    spec.name = "w" + std::to_string(m);
    spec.rows = 64;
    spec.cols = 32;
    spec.layout = layout;
    spec.layer = m;
    c.matrices.push_back(spec);
  }
  c.gpus = gpus;
  c.gpus_per_node = per_node;
  c.costs = LlamaCosts();
  c.links.latency_us = 0;
  c.links.hop_latency_us = 0;
  c.control_rounds_ms = 0;
  c.agreement_ms = 0;
  c.control_message_us = 0;
  c.hbm_bytes_per_second = std::numeric_limits<double>::infinity();
  return c;
}

constexpr int64_t kTinyWireBytes = 64 * 32 * 4;    // an fp32 gradient
constexpr int64_t kTinyUpdateBytes = 64 * 32 * 2;  // a bf16 update

TEST(ScaleSimTest, SameInputGivesTheSameResultFieldForField) {
  const SimConfig c = Config("llama3_8b_8layers", 64);
  const SimResult a = *SimulateStep(c);
  const SimResult b = *SimulateStep(c);
  EXPECT_EQ(a.clock.predicted_seconds, b.clock.predicted_seconds);
  EXPECT_EQ(a.compute_seconds_max, b.compute_seconds_max);
  EXPECT_EQ(a.clock.transfer_seconds, b.clock.transfer_seconds);
  EXPECT_EQ(a.clock.bytes_per_gpu, b.clock.bytes_per_gpu);
  EXPECT_EQ(a.clock.worker_compute_seconds, b.clock.worker_compute_seconds);
  EXPECT_EQ(a.clock.worker_compute_end_seconds,
            b.clock.worker_compute_end_seconds);
  EXPECT_EQ(a.clock.worker_stacks, b.clock.worker_stacks);
  EXPECT_EQ(a.clock.limited_by, b.clock.limited_by);
  EXPECT_GT(a.clock.predicted_seconds, 0);
}

// Infinite links and a free commit.
SimConfig FreeTransfers(SimConfig c) {
  c.links.nvlink_gbs = std::numeric_limits<double>::infinity();
  c.links.inter_node_gbs = std::numeric_limits<double>::infinity();
  c.links.copy_engine_gbs = std::numeric_limits<double>::infinity();
  c.links.latency_us = 0;
  c.links.hop_latency_us = 0;
  c.control_rounds_ms = 0;
  c.agreement_ms = 0;
  c.hbm_bytes_per_second = std::numeric_limits<double>::infinity();
  // One stack per owner and shape (and, on more than one GPU, its taper).
  c.schedule.stack_bytes = int64_t{1} << 50;
  return c;
}

TEST(ScaleSimTest, FreeTransfersAndCommitPredictTheMaxWorkerCompute) {
  for (const Layout layout :
       {Layout::kReplicated, Layout::kUnreduced, Layout::kRowSharded}) {
    for (const int gpus : {1, 8, 64}) {
      SimConfig c = FreeTransfers(Config("llama3_8b_8layers", gpus, layout));
      // mlp.down as 14336 x 4096, like gate and up: the schedule stacks
      // r x c and c x r apart, the planner batches them together.
      for (scheduler::MatrixSpec& m : c.matrices) {
        if (m.rows < m.cols && m.cols == 14336) std::swap(m.rows, m.cols);
      }
      const SimResult r = *SimulateStep(c);
      // No worker waits: gradients land at 0 and compute never waits for
      // updates going back, which take no time.
      EXPECT_EQ(r.clock.predicted_seconds, r.compute_seconds_max) << gpus;
      EXPECT_EQ(r.clock.worker_compute_end_seconds,
                r.clock.worker_compute_seconds)
          << gpus;
      EXPECT_EQ(r.clock.commit_seconds, 0) << gpus;
      EXPECT_EQ(r.clock.transfer_seconds, 0) << gpus;
      EXPECT_EQ(r.clock.limited_by, "compute") << gpus;
      // The plan's max also counts transfers at 1e18 B/s: under 0.1 us. On
      // one GPU the stacks are the plan's batches; on more, each shape's
      // last stack tapers into smaller calls, which cost a little more.
      if (gpus == 1) {
        EXPECT_NEAR(r.clock.predicted_seconds, r.plan_max_seconds, 1e-7);
      } else {
        EXPECT_GT(r.clock.predicted_seconds, r.plan_max_seconds - 1e-7) << gpus;
        EXPECT_LT(r.clock.predicted_seconds, 1.01 * r.plan_max_seconds) << gpus;
      }
    }
  }
}

TEST(ScaleSimTest, SplitOrientationsCostUnderOnePercentAgainstThePlan) {
  for (const int gpus : {1, 8, 64}) {
    const SimResult r =
        *SimulateStep(FreeTransfers(Config("llama3_8b_8layers", gpus)));
    EXPECT_NEAR(r.clock.predicted_seconds, r.plan_max_seconds,
                1e-2 * r.plan_max_seconds)
        << gpus;
  }
}

TEST(ScaleSimTest, CostScaleMultipliesEveryStack) {
  SimConfig c = FreeTransfers(Config("llama3_8b_8layers", 8));
  const SimResult one = *SimulateStep(c);
  c.cost_scale = 2;
  const SimResult two = *SimulateStep(c);
  EXPECT_EQ(two.clock.worker_stacks, one.clock.worker_stacks);
  EXPECT_DOUBLE_EQ(two.compute_seconds_max, 2 * one.compute_seconds_max);
  EXPECT_DOUBLE_EQ(two.clock.predicted_seconds,
                   2 * one.clock.predicted_seconds);
}

TEST(ScaleSimTest, CommitIsTheVotePlusApplyingHeldParameters) {
  SimConfig c = FreeTransfers(Config("llama3_8b_8layers", 8));
  c.control_rounds_ms = 4;
  c.agreement_ms = 2.5;
  c.hbm_bytes_per_second = 3e12;
  const SimResult r = *SimulateStep(c);
  // 8 bytes of fp32 parameter and a bf16 update per parameter.
  EXPECT_DOUBLE_EQ(r.clock.apply_seconds, r.parameters * 10.0 / 3e12);
  EXPECT_DOUBLE_EQ(r.clock.agreement_seconds, 2.5e-3);
  EXPECT_DOUBLE_EQ(r.clock.commit_seconds, 1.5e-3 + r.clock.apply_seconds);
  EXPECT_DOUBLE_EQ(r.clock.predicted_seconds,
                   r.clock.stage_seconds + r.clock.commit_seconds);
  // Each trainer holds 1/N of a row-sharded matrix's rows.
  c.matrices = *ModelMatrices("llama3_8b_8layers", Layout::kRowSharded);
  EXPECT_DOUBLE_EQ(SimulateStep(c)->clock.apply_seconds,
                   r.parameters * 10.0 / 3e12 / 8);
}

TEST(ScaleSimTest, ControlMessagesThroughAStarGrowWithTheRanks) {
  // Each of the rounds a trainer waits for (the agreement and the vote)
  // gathers every rank's message at rank 0 and sends its answer to each:
  // on a star 2 (N - 1) messages a round, one after another, on top of the
  // rounds' fixed cost. The vote's are in the commit; the agreement's in
  // the stage, where a stack computed ahead may hide them. Only the whole
  // job's clock counts them: the plans are weighed without (the
  // coordinator's way).
  for (const int gpus : {2, 64, 1024}) {
    SimConfig c = Config("llama3_8b_8layers", gpus, Layout::kReplicated);
    c.control_tree_fanout = 0;
    const SimResult without = *SimulateStep(c);
    c.control_message_us = 5;
    const SimResult with = *SimulateStep(c);
    const double round = 2.0 * (gpus - 1) * 5e-6;
    const double messages = scheduler::kControlRoundsAwaited * round;
    // (The commit's apply may move with the stage, where it is what is
    // left of the applies before the votes.)
    EXPECT_NEAR(
        with.clock.commit_seconds - with.clock.apply_seconds,
        without.clock.commit_seconds - without.clock.apply_seconds + round,
        1e-12)
        << gpus;
    EXPECT_NEAR(with.clock.agreement_seconds,
                without.clock.agreement_seconds + round, 1e-12)
        << gpus;
    EXPECT_GE(with.clock.predicted_seconds,
              without.clock.predicted_seconds + round - 1e-12)
        << gpus;
    EXPECT_LE(with.clock.predicted_seconds,
              without.clock.predicted_seconds + messages + 1e-12)
        << gpus;
    EXPECT_EQ(with.owner_groups, without.owner_groups) << gpus;
    EXPECT_EQ(with.bucket_bytes, without.bucket_bytes) << gpus;
    scheduler::ClockSettings s;
    s.control_rounds_ms = 4;
    s.control_message_us = 5;
    EXPECT_NEAR(scheduler::ControlSeconds(gpus, s), 4e-3 + messages, 1e-15);
  }
  // At 1024 ranks of the measured 6.3 us the messages take 25.8 ms a step:
  // past 64 GPUs, more than the rest of the 8 layers' replicated step.
  SimConfig c = Config("llama3_8b_8layers", 1024, Layout::kReplicated);
  c.control_message_us = SimConfig{}.control_message_us;
  c.control_tree_fanout = 0;
  const SimResult r = *SimulateStep(c);
  EXPECT_EQ(r.clock.limited_by, "commit");
}

TEST(ScaleSimTest, ControlMessagesAlongATreeGrowWithItsDepth) {
  // The workers' own fanout.
  EXPECT_EQ(SimConfig{}.control_tree_fanout, worker::kControlTreeFanout);
  // Up to fanout + 1 ranks the tree is a star.
  EXPECT_EQ(scheduler::ControlMessagesOnPath(17, 16), 2.0 * 16);
  EXPECT_EQ(scheduler::ControlMessagesOnPath(2, 16), 2.0);
  EXPECT_EQ(scheduler::ControlMessagesOnPath(1, 16), 0.0);
  // 18 to 273 ranks: two levels; 274 to 4369: three.
  EXPECT_EQ(scheduler::ControlMessagesOnPath(18, 16), 2.0 * (16 + 17));
  EXPECT_EQ(scheduler::ControlMessagesOnPath(273, 16), 2.0 * (16 + 17));
  EXPECT_EQ(scheduler::ControlMessagesOnPath(1024, 16), 2.0 * (16 + 2 * 17));
  // A chain: every rank passes each message on.
  EXPECT_EQ(scheduler::ControlMessagesOnPath(5, 1), 2.0 * (1 + 3 * 2));
  // At 1024 GPUs the 8 layers' replicated step is no longer the control
  // rounds': 100 messages a round instead of 2046.
  SimConfig c = Config("llama3_8b_8layers", 1024, Layout::kReplicated);
  c.control_message_us = SimConfig{}.control_message_us;
  const SimResult tree = *SimulateStep(c);
  c.control_tree_fanout = 0;
  const SimResult star = *SimulateStep(c);
  EXPECT_NEAR(star.clock.commit_seconds - star.clock.apply_seconds -
                  tree.clock.commit_seconds + tree.clock.apply_seconds,
              (2046.0 - 100.0) * 6.3e-6, 1e-9);
  EXPECT_NEAR(star.clock.agreement_seconds - tree.clock.agreement_seconds,
              (2046.0 - 100.0) * 6.3e-6, 1e-9);
}

TEST(ScaleSimTest, CriticalPathPartsAddUpToTheStep) {
  for (const Layout layout :
       {Layout::kReplicated, Layout::kUnreduced, Layout::kRowSharded}) {
    for (const int gpus : {2, 64, 512}) {
      const SimResult r =
          *SimulateStep(Config("llama3_8b_8layers", gpus, layout));
      EXPECT_NEAR(r.clock.critical_compute_seconds +
                      r.clock.critical_wait_seconds +
                      r.clock.updates_tail_seconds + r.clock.commit_seconds,
                  r.clock.predicted_seconds, 1e-12)
          << gpus;
      EXPECT_GE(r.clock.critical_wait_seconds, 0) << gpus;
      EXPECT_GE(r.clock.updates_tail_seconds, 0) << gpus;
      EXPECT_LE(r.clock.compute_end_seconds_max, r.clock.stage_seconds) << gpus;
      EXPECT_FALSE(r.clock.limited_by.empty()) << gpus;
    }
  }
}

TEST(ScaleSimTest, ReplicatedComputeNeverWaitsWhateverTheLinks) {
  SimConfig c = Config("llama3_8b_8layers", 16, Layout::kReplicated);
  c.links.nvlink_gbs = 1;  // updates back take seconds
  c.links.inter_node_gbs = 1;
  c.links.copy_engine_gbs = 1;
  c.agreement_ms = 0;  // the links alone
  const SimResult r = *SimulateStep(c);
  EXPECT_EQ(r.clock.gradients_landed_seconds, 0);
  EXPECT_EQ(r.clock.worker_compute_end_seconds, r.clock.worker_compute_seconds);
  EXPECT_EQ(r.clock.limited_by, "updates_back");
  EXPECT_GT(r.clock.updates_tail_seconds, 1);
}

TEST(ScaleSimTest, AStackWaitsOnlyForItsOwnBucket) {
  // Two matrices in two buckets on one GPU pair at 1 GB/s: all gradients
  // go first, so the stack of the first bucket starts when that bucket has
  // landed, not after both.
  SimConfig c = Tiny(2, 2, Layout::kUnreduced);
  c.links.nvlink_gbs = 1;
  c.schedule.bucket_bytes = kTinyWireBytes / 2;  // one matrix per bucket
  c.schedule.stack_bytes = 1;                    // one matrix per stack
  const SimResult r = *SimulateStep(c);
  EXPECT_DOUBLE_EQ(r.clock.gradients_landed_seconds, 2 * kTinyWireBytes / 1e9);
  double first_start = r.clock.stage_seconds;
  for (int w = 0; w < 2; ++w) {
    if (r.clock.worker_compute_seconds[w] == 0) continue;
    first_start = std::min(first_start, r.clock.worker_compute_end_seconds[w] -
                                            r.clock.worker_compute_seconds[w]);
  }
  EXPECT_DOUBLE_EQ(first_start, kTinyWireBytes / 1e9);
}

TEST(ScaleSimTest, ComputeSlowsOnlyWhileATransferIsInFlight) {
  // As above: the stack of the bucket that lands first starts at T, while
  // the other bucket's gradients move on until 2T; updates back come
  // after it (they wait for the compute issued before them).
  SimConfig c = Tiny(2, 2, Layout::kUnreduced);
  c.peer_writes = false;  // the updates by collectives too
  c.links.nvlink_gbs = 1;
  c.schedule.bucket_bytes = kTinyWireBytes / 2;
  c.schedule.stack_bytes = 1;
  const double t = kTinyWireBytes / 1e9;
  const SimResult free = *SimulateStep(c);
  c.transfer_contention = 1;  // half speed inside a phase
  const SimResult slowed = *SimulateStep(c);
  ASSERT_EQ(slowed.clock.worker_compute_seconds,
            free.clock.worker_compute_seconds);
  int first = -1;
  for (int w = 0; w < 2; ++w) {
    const double d = free.clock.worker_compute_seconds[w];
    if (d > 0 &&
        std::abs(free.clock.worker_compute_end_seconds[w] - d - t) < 1e-12) {
      first = w;
    }
  }
  ASSERT_GE(first, 0);
  // Inside [T, 2T) at half speed (T / 2 of its work), then full speed.
  const double d = free.clock.worker_compute_seconds[first];
  EXPECT_DOUBLE_EQ(slowed.clock.worker_compute_end_seconds[first],
                   d <= t / 2 ? t + 2 * d : 2 * t + d - t / 2);
  for (int w = 0; w < 2; ++w) {
    EXPECT_GE(slowed.clock.worker_compute_end_seconds[w],
              free.clock.worker_compute_end_seconds[w]);
  }
  EXPECT_GT(slowed.clock.predicted_seconds, free.clock.predicted_seconds);
  // Transfers that take no time slow nothing.
  SimConfig instant = FreeTransfers(Config("llama3_8b_8layers", 4));
  instant.peer_writes = false;
  const SimResult a = *SimulateStep(instant);
  instant.transfer_contention = 1;
  EXPECT_EQ(SimulateStep(instant)->clock.predicted_seconds,
            a.clock.predicted_seconds);
}

TEST(ScaleSimTest, DoublingGpusNeverRaisesComputeMaxByMoreThanOneMs) {
  double previous = std::numeric_limits<double>::infinity();
  for (int gpus = 1; gpus <= 1024; gpus *= 2) {
    const SimResult r = *SimulateStep(Config("llama3_8b_8layers", gpus));
    EXPECT_LE(r.compute_seconds_max, previous + 1e-3) << gpus;
    previous = r.compute_seconds_max;
  }
  previous = std::numeric_limits<double>::infinity();
  for (int gpus = 8; gpus <= 256; gpus *= 2) {
    const SimResult r = *SimulateStep(Config("llama3_8b", gpus));
    EXPECT_LE(r.compute_seconds_max, previous + 1e-3) << gpus;
    previous = r.compute_seconds_max;
  }
}

// The updates by collectives, as across nodes or without peer writes.
SimConfig Collectives(SimConfig c) {
  c.peer_writes = false;
  return c;
}

TEST(ScaleSimTest, UnreducedBytesPerGpuAreOneMatrixPerReduceAndBroadcast) {
  // Each reduce and broadcast moves the matrix through every rank of the
  // ring: 2 matrices x (the fp32 gradient's S + the bf16 update's S / 2),
  // on one node or across two.
  EXPECT_EQ(SimulateStep(Collectives(Tiny(4, 4, Layout::kUnreduced)))
                ->clock.bytes_per_gpu,
            2 * (kTinyWireBytes + kTinyUpdateBytes));
  EXPECT_EQ(SimulateStep(Tiny(4, 2, Layout::kUnreduced))->clock.bytes_per_gpu,
            2 * (kTinyWireBytes + kTinyUpdateBytes));
  // Replicated: only the updates come back.
  EXPECT_EQ(SimulateStep(Collectives(Tiny(4, 4, Layout::kReplicated)))
                ->clock.bytes_per_gpu,
            2 * kTinyUpdateBytes);
  // fp32 updates (--precision fp32) move the gradient's bytes.
  SimConfig fp32 = Collectives(Tiny(4, 4, Layout::kReplicated));
  fp32.update_bytes_per_element = 4;
  EXPECT_EQ(SimulateStep(fp32)->clock.bytes_per_gpu, 2 * kTinyWireBytes);
  // One GPU moves nothing.
  EXPECT_EQ(SimulateStep(Tiny(1, 8, Layout::kUnreduced))->clock.bytes_per_gpu,
            0);
}

TEST(ScaleSimTest, PeerWritesSendEachUpdateOnceToEveryOtherTrainer) {
  // Two owners of one matrix each on one node of 4: the update of an
  // owner's last stack goes by broadcast among more than two workers
  // (scheduler::Transfer::by_collective), as collectives would carry it.
  const SimResult r = *SimulateStep(Tiny(4, 4, Layout::kReplicated));
  ASSERT_EQ(r.owning_workers, 2);
  EXPECT_EQ(r.clock.bytes_per_gpu,
            SimulateStep(Collectives(Tiny(4, 4, Layout::kReplicated)))
                ->clock.bytes_per_gpu);
  // Eight matrices in stacks of one: the owners write the others' updates
  // into the 3 other trainers' staging.
  SimConfig eight = Tiny(4, 4, Layout::kReplicated, 8);
  eight.schedule.stack_bytes = 1;
  EXPECT_NE(SimulateStep(eight)->clock.bytes_per_gpu,
            SimulateStep(Collectives(eight))->clock.bytes_per_gpu);
  // With one peer every update is written: each owner sends its update
  // once and receives the other.
  EXPECT_EQ(SimulateStep(Tiny(2, 2, Layout::kReplicated))->clock.bytes_per_gpu,
            kTinyUpdateBytes);
  // Across nodes each node's owner group writes its own updates, as on a
  // node of its own.
  EXPECT_EQ(SimulateStep(Tiny(4, 2, Layout::kReplicated))->clock.bytes_per_gpu,
            SimulateStep(Tiny(2, 2, Layout::kReplicated))->clock.bytes_per_gpu);
  // Across nodes without owner groups, or with row-sharded parameters,
  // collectives carry them.
  SimConfig across = Tiny(4, 2, Layout::kReplicated);
  across.owner_groups = false;
  const int64_t written = SimulateStep(across)->clock.bytes_per_gpu;
  EXPECT_EQ(written, SimulateStep(Collectives(across))->clock.bytes_per_gpu);
  EXPECT_EQ(
      SimulateStep(Tiny(4, 4, Layout::kRowSharded))->clock.predicted_seconds,
      SimulateStep(Collectives(Tiny(4, 4, Layout::kRowSharded)))
          ->clock.predicted_seconds);
}

TEST(ScaleSimTest, PeerWritesRunOnTheOwnersStreamAndSlowNoCompute) {
  // Replicated on 2 GPUs of one node, one matrix per stack: each owner's
  // writes follow its own compute at the copy engines' rate, whatever the
  // contention of collectives, and the stage ends with the last write.
  SimConfig c = Tiny(2, 2, Layout::kReplicated);
  c.links.copy_engine_gbs = 1;  // 1e9 B/s
  c.schedule.stack_bytes = 1;
  c.transfer_contention = 1;
  const SimResult r = *SimulateStep(c);
  double last_write = 0;
  for (int w = 0; w < 2; ++w) {
    EXPECT_DOUBLE_EQ(r.clock.worker_compute_end_seconds[w],
                     r.clock.worker_compute_seconds[w]);
    if (r.clock.worker_compute_seconds[w] == 0) continue;
    last_write = std::max(last_write, r.clock.worker_compute_end_seconds[w] +
                                          kTinyUpdateBytes / 1e9);
  }
  EXPECT_DOUBLE_EQ(r.clock.stage_seconds, last_write);
}

// Every update applied at the commit, as a grouped plan's workers apply
// them (applies before the votes: below).
SimConfig AtTheCommit(SimConfig c) {
  c.apply_early = false;
  return c;
}

TEST(ScaleSimTest, ReplicatedStepNeverGrowsWithTheGpuCount) {
  // Owner groups of 1, 2, 4, ... nodes of 8 are on offer from 16 GPUs: each
  // group's workers own every matrix, so a grouped step is the step of one
  // group's GPUs alone. Groupings are tried one node first, then largest
  // first; the shortest
  // step of them and of the plan of every worker is taken, so no count of
  // GPUs takes longer than a smaller count that divides it. (With the
  // updates applied at the commit: a grouped plan's are, where the plan of
  // every worker may apply them before the votes and dip below.)
  const auto Config = [](const std::string& model, int gpus, Layout layout) {
    return AtTheCommit(muonps::bench::Config(model, gpus, layout));
  };
  for (const char* model : {"llama3_8b_8layers", "llama3_8b"}) {
    const SimResult eight =
        *SimulateStep(Config(model, 8, Layout::kReplicated));
    EXPECT_EQ(eight.owner_groups, 1);
    EXPECT_EQ(eight.group_size, 8);
    EXPECT_EQ(eight.weighed.ungrouped_seconds, 0);  // none offered on one node
    std::vector<double> steps = {eight.clock.predicted_seconds};
    // The plan of every worker's step at 8, 16, 32, ... GPUs.
    std::vector<double> alone = steps;
    for (int gpus = 16; gpus <= 1024; gpus *= 2) {
      const SimResult r =
          *SimulateStep(Config(model, gpus, Layout::kReplicated));
      ASSERT_FALSE(r.weighed.grouped_candidates.empty())
          << model << " " << gpus;
      // Groups of one node first, then the largest.
      EXPECT_EQ(r.weighed.grouped_candidates[0].first, 8);
      EXPECT_NEAR(r.weighed.grouped_candidates[0].second,
                  eight.clock.predicted_seconds, 1e-12)
          << model << " " << gpus;
      if (gpus > 16) {
        ASSERT_GT(r.weighed.grouped_candidates.size(), 1u);
        EXPECT_EQ(r.weighed.grouped_candidates[1].first, gpus / 2);
      }
      // Each grouping clocks as the plan of its group's GPUs alone.
      for (const auto& [members, seconds] : r.weighed.grouped_candidates) {
        const int at = static_cast<int>(std::log2(members / 8));
        ASSERT_LT(at, static_cast<int>(alone.size()));
        EXPECT_NEAR(seconds, alone[at], 1e-9 * alone[at])
            << model << " " << gpus << " groups of " << members;
      }
      EXPECT_GT(r.weighed.ungrouped_seconds, 0) << gpus;
      EXPECT_DOUBLE_EQ(
          r.clock.predicted_seconds,
          std::min(r.weighed.grouped_seconds, r.weighed.ungrouped_seconds))
          << model << " " << gpus;
      EXPECT_LE(r.clock.predicted_seconds, steps.back() * (1 + 1e-9))
          << model << " " << gpus;
      if (r.owner_groups > 1) {
        EXPECT_EQ(r.owner_groups * r.group_size, gpus);
        EXPECT_TRUE(r.weighed.groups_declined.empty())
            << r.weighed.groups_declined;
      }
      steps.push_back(r.clock.predicted_seconds);
      alone.push_back(r.weighed.ungrouped_seconds);
    }
    // Past 64 GPUs the plan of every worker grows (each phase's ring fills
    // over every rank); groups of one 64-GPU step's size hold it.
    const SimResult most =
        *SimulateStep(Config(model, 1024, Layout::kReplicated));
    EXPECT_GT(most.owner_groups, 1) << model;
    EXPECT_LT(most.clock.predicted_seconds, most.weighed.ungrouped_seconds)
        << model;
  }
  // On a network of 5 GB/s a GPU the groups of one node win everywhere:
  // the step stays the 8 GPUs' exactly.
  const SimResult eight =
      *SimulateStep(Config("llama3_8b_8layers", 8, Layout::kReplicated));
  for (int gpus = 16; gpus <= 1024; gpus *= 4) {
    SimConfig c = Config("llama3_8b_8layers", gpus, Layout::kReplicated);
    c.links.inter_node_gbs = 5;
    const SimResult r = *SimulateStep(c);
    EXPECT_EQ(r.owner_groups, gpus / 8) << gpus;
    EXPECT_EQ(r.group_size, 8) << gpus;
    EXPECT_TRUE(r.weighed.groups_declined.empty()) << r.weighed.groups_declined;
    EXPECT_DOUBLE_EQ(r.clock.predicted_seconds, eight.clock.predicted_seconds)
        << gpus;
    EXPECT_EQ(r.clock.bytes_per_gpu, eight.clock.bytes_per_gpu) << gpus;
    EXPECT_EQ(r.owning_workers, gpus) << gpus;
  }
}

// The plan of every worker applies its updates before the votes only where
// the clock says that is faster: on one node, where Newton-Schulz ends the
// stage and the applies (8 bytes a parameter more, for the copy aside)
// would follow it, the commit keeps them; where the updates going back are
// the stage's tail, they run beside it. Never slower than the commit's way,
// and a grouped plan applies at the commit.
TEST(ScaleSimTest, UpdatesApplyBeforeTheVotesOnlyWhereThatIsFaster) {
  for (const char* model : {"llama3_8b_8layers", "llama3_8b"}) {
    for (const Layout layout :
         {Layout::kReplicated, Layout::kUnreduced, Layout::kRowSharded}) {
      for (const int gpus : {2, 8, 64, 1024}) {
        const SimResult either = *SimulateStep(Config(model, gpus, layout));
        const SimResult commit =
            *SimulateStep(AtTheCommit(Config(model, gpus, layout)));
        EXPECT_FALSE(commit.clock.applies.before_votes);
        EXPECT_LE(either.clock.predicted_seconds,
                  commit.clock.predicted_seconds * (1 + 1e-9))
            << model << " " << gpus;
        // Weighed, owner groups too: the plan's two ways, the faster taken.
        ASSERT_GT(either.weighed.before_votes_seconds, 0)
            << model << " " << gpus;
        EXPECT_EQ(either.clock.applies.before_votes,
                  either.weighed.before_votes_seconds <
                      either.weighed.at_commit_seconds)
            << model << " " << gpus;
      }
    }
  }
  // HSDP's owner groups (row-sharded: no peer's trainer could repair a
  // killed worker's rows) apply at the commit.
  SimConfig hsdp = Config("llama3_8b", 256, Layout::kRowSharded);
  hsdp.hsdp_shard_gpus = 64;
  const SimResult sharded = *SimulateStep(hsdp);
  EXPECT_EQ(sharded.owner_groups, 4);
  EXPECT_FALSE(sharded.clock.applies.before_votes);
  EXPECT_EQ(sharded.weighed.before_votes_seconds, 0);
  // One node, replicated: Newton-Schulz ends the stage; the commit's way.
  const SimResult eight =
      *SimulateStep(Config("llama3_8b_8layers", 8, Layout::kReplicated));
  EXPECT_FALSE(eight.clock.applies.before_votes);
  EXPECT_GT(eight.clock.applies.left_seconds,
            eight.clock.applies.at_commit_seconds);
  // Llama-3-8B replicated on 64 GPUs: the updates crossing the NICs are the
  // tail, and the applies run beside them.
  const SimResult wide =
      *SimulateStep(Config("llama3_8b", 64, Layout::kReplicated));
  EXPECT_EQ(wide.owner_groups, 1);
  EXPECT_TRUE(wide.clock.applies.before_votes);
  EXPECT_LT(wide.clock.applies.left_seconds,
            0.5 * wide.clock.applies.at_commit_seconds);
}

// What is left of the applies before the votes: each worker's compute
// stream, once its own stacks are done, applies each bucket once it
// landed, 8 + 8 + 2 bytes a parameter (keep, apply with bf16 updates).
TEST(ScaleSimTest, AppliesBeforeTheVotesFollowTheLandingsOnEachWorker) {
  SimConfig c = Tiny(2, 8, Layout::kReplicated);
  c.hbm_bytes_per_second = 1e6;  // slow enough to see
  const SimResult r = *SimulateStep(c);
  const double per_matrix = 64.0 * 32 * (16 + 2) / 1e6;
  // Every worker applies both matrices after its stacks and both landings.
  double last = 0;
  for (const double end : r.clock.worker_compute_end_seconds) {
    last = std::max(last, end);
  }
  EXPECT_NEAR(r.clock.applies.left_seconds,
              std::max(0.0, std::max(last, r.clock.stage_seconds) +
                                2 * per_matrix - r.clock.stage_seconds),
              0.6 * per_matrix);
  EXPECT_DOUBLE_EQ(r.clock.applies.at_commit_seconds,
                   2 * 64.0 * 32 * (8 + 2) / 1e6);
  EXPECT_EQ(r.clock.applies.before_votes,
            r.clock.applies.left_seconds < r.clock.applies.at_commit_seconds);
}

TEST(ScaleSimTest, OwnerGroupsOnlyForReplicatedJobsOnEqualNodes) {
  // Whether groups were on offer (both plans clocked), and what was taken,
  // on a slow network where they win when offered.
  const auto groups = [](SimConfig c) {
    c.links.inter_node_gbs = 0.5;
    const SimResult r = *SimulateStep(c);
    return std::make_tuple(r.weighed.ungrouped_seconds > 0, r.owner_groups,
                           r.group_size);
  };
  using Groups = std::tuple<bool, int, int>;
  EXPECT_EQ(groups(Tiny(16, 8, Layout::kReplicated)), Groups(true, 2, 8));
  EXPECT_EQ(groups(Tiny(16, 8, Layout::kUnreduced)), Groups(false, 1, 16));
  EXPECT_EQ(groups(Tiny(16, 8, Layout::kRowSharded)), Groups(false, 1, 16));
  EXPECT_EQ(groups(Tiny(8, 8, Layout::kReplicated)), Groups(false, 1, 8));
  // Nodes of 8 and 4.
  EXPECT_EQ(groups(Tiny(12, 8, Layout::kReplicated)), Groups(false, 1, 12));
  SimConfig off = Tiny(16, 8, Layout::kReplicated);
  off.owner_groups = false;
  EXPECT_EQ(groups(off), Groups(false, 1, 16));
}

TEST(ScaleSimTest, AGroupTooSmallForTheMomentumLosesToThePlanOfEveryWorker) {
  // 3.5 GiB a GPU, 2 GiB of it work buffers: the 8 layers' momentum and
  // staging (8 bytes a parameter, 14 GB) fit 16 GPUs but not the 8 of one
  // node, so one group per node cannot be planned: every worker is.
  SimConfig c = Config("llama3_8b_8layers", 16, Layout::kReplicated);
  c.gpu_memory_bytes = int64_t{7} << 29;
  const absl::StatusOr<SimResult> r = SimulateStep(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->owner_groups, 1);
  EXPECT_EQ(r->weighed.grouped_seconds, 0);
  EXPECT_THAT(r->weighed.groups_declined, HasSubstr("RESOURCE_EXHAUSTED"));
  EXPECT_THAT(r->weighed.groups_declined,
              HasSubstr("one owner group of 8 workers"));
}

TEST(ScaleSimTest, RowShardedOwnerReceivesAndSendsAllButItsOwnRows) {
  // One matrix on 4 GPUs: the owner gathers 3 of 4 row ranges and
  // scatters them back.
  const SimResult r = *SimulateStep(Tiny(4, 4, Layout::kRowSharded, 1));
  EXPECT_EQ(r.clock.bytes_per_gpu, 3 * kTinyWireBytes / 4);
}

TEST(ScaleSimTest, TransferTimeIsBytesOverTheLinkPerPhase) {
  SimConfig c = Collectives(Tiny(4, 4, Layout::kUnreduced, 1));
  c.links.nvlink_gbs = 1;  // 1e9 B/s
  const SimResult r = *SimulateStep(c);
  // One reduce phase of the gradient's bytes and one broadcast phase of
  // the update's, with the stack between them.
  EXPECT_DOUBLE_EQ(r.clock.transfer_seconds,
                   (kTinyWireBytes + kTinyUpdateBytes) / 1e9);
  EXPECT_DOUBLE_EQ(r.clock.gradients_landed_seconds, kTinyWireBytes / 1e9);
  EXPECT_DOUBLE_EQ(r.clock.predicted_seconds,
                   r.clock.transfer_seconds + r.compute_seconds_max);
  EXPECT_DOUBLE_EQ(r.clock.critical_wait_seconds, kTinyWireBytes / 1e9);
  EXPECT_NEAR(r.clock.updates_tail_seconds, kTinyUpdateBytes / 1e9, 1e-15);
  // A reduce at half the rate takes twice as long; the broadcast does not
  // change, nor the bytes.
  c.links.reduce_gbs = 0.5;
  const SimResult slow_reduce = *SimulateStep(c);
  EXPECT_DOUBLE_EQ(slow_reduce.clock.gradients_landed_seconds,
                   2 * kTinyWireBytes / 1e9);
  EXPECT_DOUBLE_EQ(slow_reduce.clock.transfer_seconds,
                   (2 * kTinyWireBytes + kTinyUpdateBytes) / 1e9);
  EXPECT_EQ(slow_reduce.clock.bytes_per_gpu, r.clock.bytes_per_gpu);
  c.links.reduce_gbs = 0;
  // Across nodes the NIC carries S / G of each ring collective.
  c.gpus_per_node = 2;
  c.links.nvlink_gbs = 1000;
  c.links.inter_node_gbs = 1;
  EXPECT_DOUBLE_EQ(SimulateStep(c)->clock.transfer_seconds,
                   (kTinyWireBytes / 2 + kTinyUpdateBytes / 2) / 1e9);
}

TEST(ScaleSimTest, RingFillLatencyIsPaidOncePerPhase) {
  SimConfig c = Tiny(16, 8, Layout::kUnreduced);
  c.links.nvlink_gbs = std::numeric_limits<double>::infinity();
  c.links.inter_node_gbs = std::numeric_limits<double>::infinity();
  c.links.latency_us = 1;
  c.links.hop_latency_us = 2;
  c.schedule.bucket_bytes = int64_t{1} << 30;  // one bucket: two phases
  c.node_exchange = false;                     // the rings
  const SimResult r = *SimulateStep(c);
  EXPECT_EQ(r.clock.phases, 2);
  // Per phase: 2 collectives x 1 us + 15 hops x 2 us.
  EXPECT_NEAR(r.clock.latency_seconds, 2 * (2e-6 + 15 * 2e-6), 1e-12);
  // The exchange on offer: 3 launches of one hop each a phase (within the
  // nodes, along the rails of 2 nodes, the parts within the owner's node),
  // taken on these free links.
  c.node_exchange = true;
  const SimResult exchange = *SimulateStep(c);
  EXPECT_TRUE(exchange.exchange_taken);
  EXPECT_NEAR(
      exchange.weighed.rings_seconds - exchange.weighed.exchange_seconds,
      r.clock.latency_seconds - 2 * 3 * 3e-6, 1e-12);
  EXPECT_NEAR(exchange.clock.latency_seconds, 2 * 3 * 3e-6, 1e-12);
}

TEST(ScaleSimTest, AdamWReferenceScalesWithParametersAndShards) {
  const SimResult r = *SimulateStep(Config("llama3_8b_8layers", 64));
  EXPECT_EQ(r.parameters, 8 * int64_t{218103808});
  EXPECT_NEAR(r.adamw_data_parallel_seconds, 14.2e-3 * r.parameters / 1.74e9,
              1e-12);
  EXPECT_NEAR(r.adamw_sharded_seconds, r.adamw_data_parallel_seconds / 64,
              1e-12);
}

// HSDP: replica groups of a fixed shard size, each planned as one owner
// group (required, as the coordinator plans a job of replica groups). Each
// group gathers its own rows to its own owners (through relays on its own
// nodes, as one shard group's job alone does), so past one shard group the
// step is that group's alone, at every count. (Owner groups apply their
// updates at the commit: so does the shard group's job here.)
TEST(ScaleSimTest, HsdpStepIsItsShardGroupsAtEveryCount) {
  for (const char* model : {"llama3_8b_8layers", "llama3_8b"}) {
    SimConfig alone = Config(model, 64, Layout::kRowSharded);
    alone.apply_early = false;
    const SimResult shard = *SimulateStep(alone);
    EXPECT_TRUE(shard.exchange_taken) << model;
    EXPECT_EQ(shard.owner_groups, 1);
    double last = shard.clock.predicted_seconds;
    for (int gpus = 128; gpus <= 1024; gpus *= 2) {
      SimConfig c = Config(model, gpus, Layout::kRowSharded);
      c.hsdp_shard_gpus = 64;
      const SimResult r = *SimulateStep(c);
      EXPECT_EQ(r.owner_groups, gpus / 64) << model << " " << gpus;
      EXPECT_EQ(r.group_size, 64);
      EXPECT_EQ(r.weighed.ungrouped_seconds, 0) << "required: nothing weighed";
      EXPECT_TRUE(r.exchange_taken) << model << " " << gpus;
      EXPECT_NEAR(r.clock.predicted_seconds, shard.clock.predicted_seconds,
                  0.01 * shard.clock.predicted_seconds)
          << model << " " << gpus;
      EXPECT_LE(r.clock.predicted_seconds, last * (1 + 1e-9))
          << model << " " << gpus;
      last = r.clock.predicted_seconds;
    }
  }
  // Llama-3-8B on 1024 GPUs in shard groups of 128: within 40 ms.
  SimConfig c = Config("llama3_8b", 1024, Layout::kRowSharded);
  c.hsdp_shard_gpus = 128;
  EXPECT_LT(SimulateStep(c)->clock.predicted_seconds, 40e-3);
}

// The DeepSeek-V3-like set under FSDP2: each GPU's trainer holds whole
// experts of every stack (256 of them: past 256 GPUs some hold none). The
// plan owns every expert where it is held, so none moves, and the step
// never grows with the GPU count, where experts gathered whole from their
// holders (the plan that only swaps them home where that costs nothing)
// grew from 256 GPUs on.
TEST(ScaleSimTest, WholeExpertsOwnedWhereHeldKeepTheMoeStepShrinking) {
  double last = 0;
  for (const int gpus : {64, 256, 1024}) {
    const SimResult r =
        *SimulateStep(Config("deepseek_v3_like", gpus, Layout::kRowSharded));
    EXPECT_TRUE(r.weighed.experts_at_holders) << gpus;
    EXPECT_GT(r.weighed.where_free_seconds, r.weighed.at_holders_seconds)
        << gpus;
    // The dense matrices' rows may go through relays besides.
    EXPECT_NEAR(r.clock.predicted_seconds,
                r.exchange_taken ? r.weighed.exchange_seconds
                                 : r.weighed.at_holders_seconds,
                1e-9 * r.weighed.at_holders_seconds);
    EXPECT_LE(r.clock.predicted_seconds,
              r.weighed.at_holders_seconds * (1 + 1e-9));
    if (last > 0) {
      EXPECT_LE(r.clock.predicted_seconds, last) << gpus;
    }
    last = r.clock.predicted_seconds;
  }
  // Sets without experts weigh nothing.
  const SimResult dense =
      *SimulateStep(Config("llama3_8b_8layers", 64, Layout::kRowSharded));
  EXPECT_EQ(dense.weighed.at_holders_seconds, 0);
  EXPECT_FALSE(dense.weighed.experts_at_holders);
}

TEST(ScaleSimTest, BadInputNamesTheFlag) {
  SimConfig c = Config("llama3_8b_8layers", 0);
  absl::StatusOr<SimResult> r = SimulateStep(c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--gpus"));

  c.gpus = 8;
  c.links.nvlink_gbs = -1;
  r = SimulateStep(c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--nvlink_gbs"));

  c.links.nvlink_gbs = 300;
  c.hsdp_shard_gpus = 3;
  r = SimulateStep(c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--hsdp_shard_gpus"));

  c.hsdp_shard_gpus = 0;
  c.links.inter_node_gbs = -50;
  EXPECT_THAT(SimulateStep(c).status().message(),
              HasSubstr("--inter_node_gbs"));

  c.links.inter_node_gbs = 50;
  c.cost_scale = 0;
  EXPECT_THAT(SimulateStep(c).status().message(), HasSubstr("--cost_scale"));
  c.cost_scale = 1;
  c.hbm_bytes_per_second = 0;
  EXPECT_THAT(SimulateStep(c).status().message(), HasSubstr("--hbm_bw"));
  c.hbm_bytes_per_second = 3e12;
  c.control_rounds_ms = -1;
  EXPECT_THAT(SimulateStep(c).status().message(),
              HasSubstr("--control_rounds_ms"));
  c.control_rounds_ms = 4;
  for (const double agreement : {-1.0, 4.5}) {
    c.agreement_ms = agreement;
    EXPECT_THAT(SimulateStep(c).status().message(),
                HasSubstr("--agreement_ms"));
  }
  c.agreement_ms = 4;  // all of the rounds' fixed cost: allowed
  EXPECT_TRUE(SimulateStep(c).ok());
  c.agreement_ms = 2.5;
  c.costs = nullptr;
  r = SimulateStep(c);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("--cost_table"));

  for (const std::string path : {"", "/nonexistent/cost-table.jsonl"}) {
    const auto table = LoadCostTable(path);
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(table.status().message(), HasSubstr("--cost_table"));
  }
  EXPECT_THAT(ModelMatrices("gpt5", Layout::kUnreduced).status().message(),
              HasSubstr("--model"));
  EXPECT_THAT(ParseLayout("sharded", "--layouts").status().message(),
              HasSubstr("--layouts"));
}

}  // namespace
}  // namespace bench
}  // namespace muonps
