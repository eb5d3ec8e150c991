#include "bench/scale_sim/scale_sim.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "bench/scale_sim/measured_steps.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/cost_table.h"

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
    kernels::NsAlgorithm algorithm;
    double b1, b4, b16;
  } curves[] = {
      {1024, 4096, kernels::NsAlgorithm::kGram, 0.000306, 0.000755, 0.00244},
      {4096, 4096, kernels::NsAlgorithm::kNs5, 0.00267, 0.0102, 0.0428},
      {4096, 14336, kernels::NsAlgorithm::kGram, 0.00486, 0.0196, 0.0782},
  };
  for (const auto& c : curves) {
    EXPECT_TRUE(table->Add(c.rows, c.cols, c.algorithm, 1, c.b1).ok());
    EXPECT_TRUE(table->Add(c.rows, c.cols, c.algorithm, 4, c.b4).ok());
    EXPECT_TRUE(table->Add(c.rows, c.cols, c.algorithm, 16, c.b16).ok());
  }
  return table;
}

SimConfig Config(const std::string& model, int gpus,
                 Layout layout = Layout::kUnreduced) {
  SimConfig c;
  c.model = model;
  c.matrices = *ModelMatrices(model, layout);
  c.gpus = gpus;
  c.costs = LlamaCosts();
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
  return c;
}

constexpr int64_t kTinyWireBytes = 64 * 32 * 4;  // fp32 on the wire

TEST(ScaleSimTest, SameInputGivesTheSameResultFieldForField) {
  const SimConfig c = Config("llama3_8b_8layers", 64);
  const SimResult a = *SimulateStep(c);
  const SimResult b = *SimulateStep(c);
  EXPECT_EQ(a.predicted_seconds, b.predicted_seconds);
  EXPECT_EQ(a.compute_seconds_max, b.compute_seconds_max);
  EXPECT_EQ(a.transfer_seconds, b.transfer_seconds);
  EXPECT_EQ(a.bytes_per_gpu, b.bytes_per_gpu);
  EXPECT_EQ(a.worker_compute_seconds, b.worker_compute_seconds);
  EXPECT_GT(a.predicted_seconds, 0);
}

SimConfig FreeTransfers(SimConfig c) {
  c.links.nvlink_gbs = std::numeric_limits<double>::infinity();
  c.links.inter_node_gbs = std::numeric_limits<double>::infinity();
  c.links.latency_us = 0;
  c.links.hop_latency_us = 0;
  // One stack per owner and shape, as the planner batches.
  c.schedule.stack_bytes = int64_t{1} << 50;
  return c;
}

TEST(ScaleSimTest, InfiniteBandwidthPredictsThePlannersMaxWorkerCompute) {
  for (const int gpus : {1, 8, 64}) {
    SimConfig c = FreeTransfers(Config("llama3_8b_8layers", gpus));
    // mlp.down as 14336 x 4096, like gate and up: the schedule stacks r x c
    // and c x r apart, the planner batches them together.
    for (scheduler::MatrixSpec& m : c.matrices) {
      if (m.rows < m.cols && m.cols == 14336) std::swap(m.rows, m.cols);
    }
    const SimResult r = *SimulateStep(c);
    EXPECT_DOUBLE_EQ(r.predicted_dependencies_seconds, r.compute_seconds_max)
        << gpus;
    // The plan's max also counts transfers at 1e18 B/s: under 0.1 us.
    EXPECT_NEAR(r.predicted_dependencies_seconds, r.plan_max_seconds, 1e-7)
        << gpus;
    EXPECT_EQ(r.transfer_seconds, 0) << gpus;
    // As the worker orders its streams, updates-back phases are barriers.
    EXPECT_GE(r.predicted_seconds, r.compute_seconds_max) << gpus;
  }
}

TEST(ScaleSimTest, SplitOrientationsCostUnderOnePercentAgainstThePlan) {
  for (const int gpus : {1, 8, 64}) {
    const SimResult r =
        *SimulateStep(FreeTransfers(Config("llama3_8b_8layers", gpus)));
    EXPECT_NEAR(r.predicted_dependencies_seconds, r.plan_max_seconds,
                1e-2 * r.plan_max_seconds)
        << gpus;
  }
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

TEST(ScaleSimTest, UnreducedBytesPerGpuAreOneMatrixPerReduceAndBroadcast) {
  // Each reduce and broadcast moves the matrix through every rank of the
  // ring: 2 matrices x 2 collectives x S, on one node or across two.
  EXPECT_EQ(SimulateStep(Tiny(4, 4, Layout::kUnreduced))->bytes_per_gpu,
            4 * kTinyWireBytes);
  EXPECT_EQ(SimulateStep(Tiny(4, 2, Layout::kUnreduced))->bytes_per_gpu,
            4 * kTinyWireBytes);
  // Replicated gradients only come back.
  EXPECT_EQ(SimulateStep(Tiny(4, 4, Layout::kReplicated))->bytes_per_gpu,
            2 * kTinyWireBytes);
  // One GPU moves nothing.
  EXPECT_EQ(SimulateStep(Tiny(1, 8, Layout::kUnreduced))->bytes_per_gpu, 0);
}

TEST(ScaleSimTest, RowShardedOwnerReceivesAndSendsAllButItsOwnRows) {
  // One matrix on 4 GPUs: the owner gathers 3 of 4 row ranges and
  // scatters them back.
  const SimResult r = *SimulateStep(Tiny(4, 4, Layout::kRowSharded, 1));
  EXPECT_EQ(r.bytes_per_gpu, 3 * kTinyWireBytes / 4);
}

TEST(ScaleSimTest, TransferTimeIsBytesOverTheLinkPerPhase) {
  SimConfig c = Tiny(4, 4, Layout::kUnreduced, 1);
  c.links.nvlink_gbs = 1;  // 1e9 B/s
  const SimResult r = *SimulateStep(c);
  // One reduce phase and one broadcast phase of S bytes each.
  EXPECT_DOUBLE_EQ(r.transfer_seconds, 2 * kTinyWireBytes / 1e9);
  EXPECT_DOUBLE_EQ(r.predicted_seconds,
                   r.transfer_seconds + r.compute_seconds_max);
  // Across nodes the NIC carries S / G of each ring collective.
  c.gpus_per_node = 2;
  c.links.nvlink_gbs = 1000;
  c.links.inter_node_gbs = 1;
  EXPECT_DOUBLE_EQ(SimulateStep(c)->transfer_seconds,
                   2 * (kTinyWireBytes / 2) / 1e9);
}

TEST(ScaleSimTest, RingFillLatencyIsPaidOncePerPhase) {
  SimConfig c = Tiny(16, 8, Layout::kUnreduced);
  c.links.nvlink_gbs = std::numeric_limits<double>::infinity();
  c.links.inter_node_gbs = std::numeric_limits<double>::infinity();
  c.links.latency_us = 1;
  c.links.hop_latency_us = 2;
  c.schedule.bucket_bytes = int64_t{1} << 30;  // one bucket: two phases
  const SimResult r = *SimulateStep(c);
  EXPECT_EQ(r.phases, 2);
  // Per phase: 2 collectives x 1 us + 15 hops x 2 us.
  EXPECT_NEAR(r.latency_seconds, 2 * (2e-6 + 15 * 2e-6), 1e-12);
}

TEST(ScaleSimTest, AdamWReferenceScalesWithParametersAndShards) {
  const SimResult r = *SimulateStep(Config("llama3_8b_8layers", 64));
  EXPECT_EQ(r.parameters, 8 * int64_t{218103808});
  EXPECT_NEAR(r.adamw_data_parallel_seconds, 14.2e-3 * r.parameters / 1.74e9,
              1e-12);
  EXPECT_NEAR(r.adamw_sharded_seconds, r.adamw_data_parallel_seconds / 64,
              1e-12);
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
  c.links.inter_node_gbs = -50;
  EXPECT_THAT(SimulateStep(c).status().message(),
              HasSubstr("--inter_node_gbs"));

  c.links.inter_node_gbs = 50;
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

TEST(MeasuredStepsTest, KeepsOnlyNGpuStepLines) {
  const auto steps = ParseMeasuredSteps(
      "# a comment\n"
      "{\"what\":\"muonps_ns_all\",\"ms\":167}\n"
      "{\"what\":\"muonps_step_1gpu\",\"ms\":175.3}\n"
      "{\"what\":\"muonps_step_1gpu_2workers\",\"ms\":184.2}\n"
      "{\"what\":\"muonps_step_return\",\"ms\":0.1}\n"
      "\n"
      "{\"what\":\"muonps_step_4gpu\",\"ms\":60,\"layout\":\"unreduced\","
      "\"predicted_ms\":55}\n");
  ASSERT_TRUE(steps.ok()) << steps.status();
  ASSERT_EQ(steps->size(), 2u);
  EXPECT_EQ((*steps)[0].gpus, 1);
  EXPECT_EQ((*steps)[0].layout, Layout::kReplicated);
  EXPECT_EQ((*steps)[0].line, 3);
  EXPECT_FALSE((*steps)[0].predicted_ms.has_value());
  EXPECT_EQ((*steps)[1].gpus, 4);
  EXPECT_EQ((*steps)[1].layout, Layout::kUnreduced);
  EXPECT_EQ((*steps)[1].ms, 60);
  EXPECT_EQ((*steps)[1].predicted_ms, 55);
}

TEST(MeasuredStepsTest, MalformedLinesNameTheLine) {
  EXPECT_THAT(ParseMeasuredSteps("{}\nnot json\n").status().message(),
              HasSubstr("--measured line 2"));
  EXPECT_THAT(
      ParseMeasuredSteps("{\"what\":\"muonps_step_2gpu\"}").status().message(),
      HasSubstr("ms must be"));
  EXPECT_THAT(ParseMeasuredSteps("{\"what\":\"muonps_step_2gpu\",\"ms\":1,"
                                 "\"layout\":\"fsdp\"}")
                  .status()
                  .message(),
              HasSubstr("layout"));
  EXPECT_EQ(LoadMeasuredSteps("/nonexistent").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace bench
}  // namespace muonps
