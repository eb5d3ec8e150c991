// scale_sim: predicts a muonps optimizer step on 64-1024 GPUs (issue 20).
// The real planner and step schedule run on the model's matrices and N
// colocated workers; the clock is simulated from a measured cost table and
// link figures (scale_sim.h says what overlaps and what serializes).
//
// Usage (from the repository root; one command, shown over three lines):
//   bazel run //bench/scale_sim:scale_sim_main --
//     --cost_table=$PWD/bench/results/2026-11-23-h200-cost-table.jsonl
//     --models=llama3_8b_8layers,llama3_8b --gpus=64,128,256,512,1024
// prints one line per (model, layout, N):
//   {"what":"sim_step","model":..,"gpus":N,"layout":..,"predicted_ms":..,
//    "predicted_dependencies_ms":..,"compute_ms_max":..,"transfer_ms_max":..,"imbalance":..,
//    "adamw_ms":..,"ratio_vs_adamw":..,"adamw_sharded_ms":..,
//    "ratio_vs_adamw_sharded":..,"bytes_per_gpu":..,...}
// predicted_dependencies_ms: the same schedule with only data dependencies
// between streams (scale_sim.h); predicted_ms is as the worker runs it.
// transfer_ms_max: every worker takes part in every phase, so it is the
// busy time of the one transfer timeline (latency_ms of it is latency).
// adamw_ms: fused AdamW of the same parameters when every GPU steps all of
// them (data parallel: 14.2 ms x parameters / 1.74e9, measured on one
// H200); adamw_sharded_ms: FSDP-style, each GPU steps 1/N of them.
// ddp_allreduce_ms: DDP's ring all-reduce of the same gradients on the same
// links; the unreduced layout replaces it, so unreduced lines add
// ratio_vs_adamw_plus_allreduce, the fair ratio there (replicated gradients
// were all-reduced before the step).
// imbalance: max / mean of the workers' compute, over all N workers.
//
// With --measured=FILE (JSON lines as bench/step_gpu prints them,
// measured_steps.h) it instead simulates each muonps_step_<N>gpu line with
// the first --models entry and the line's layout, and prints
//   {"what":"sim_validation","gpus":N,"layout":..,"predicted_ms":..,
//    "measured_ms":..,"error":(predicted - measured) / measured}
//
// Link flags:
//   --nvlink_gbs      per GPU per direction among one node's GPUs; default
//                     300, the NCCL all-to-all bus bandwidth among 4 H200s
//   --inter_node_gbs  each GPU's NIC; default 50 (a 400 Gb/s port; not
//                     measured)
//   --latency_us      per collective; default 8.4 } NCCL's tuning model for
//   --hop_latency_us  per ring hop; default 3.4   } ring/Simple (not measured)
// Exits 2 with the error on stderr for bad flags (INVALID_ARGUMENT naming
// the flag), 1 for other failures.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/scale_sim/measured_steps.h"
#include "bench/scale_sim/scale_sim.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, models, "llama3_8b_8layers,llama3_8b",
          "Matrix sets: llama3_8b_8layers, llama3_8b, deepseek_v3_like.");
ABSL_FLAG(std::string, gpus, "64,128,256,512,1024", "GPU counts N.");
ABSL_FLAG(std::string, layouts, "unreduced",
          "Gradient layouts: replicated, unreduced, row_sharded.");
ABSL_FLAG(int, gpus_per_node, 8, "GPUs per node (NVLink domain).");
ABSL_FLAG(double, nvlink_gbs, 300, "NVLink GB/s per GPU per direction.");
ABSL_FLAG(double, inter_node_gbs, 50, "Network GB/s per GPU per direction.");
ABSL_FLAG(double, latency_us, 8.4, "Latency per collective (us).");
ABSL_FLAG(double, hop_latency_us, 3.4, "Latency per ring hop (us).");
ABSL_FLAG(std::string, cost_table, "",
          "Measured Newton-Schulz times (scheduler/cost_table.h format).");
ABSL_FLAG(int, wire_bytes_per_element, 4,
          "Bytes per element on the wire (the worker sends fp32).");
ABSL_FLAG(double, gpu_memory_gib, 140, "Memory per GPU for the planner.");
ABSL_FLAG(int, bucket_mib, 64, "Step schedule bucket size (MiB).");
ABSL_FLAG(int, stack_mib, 1024, "Step schedule stack size (MiB, fp32).");
ABSL_FLAG(double, adamw_reference_ms, 14.2,
          "Fused AdamW ms for --adamw_reference_params on one GPU.");
ABSL_FLAG(double, adamw_reference_params, 1.74e9,
          "Parameters of the AdamW reference.");
ABSL_FLAG(std::string, measured, "",
          "Measured step lines: validate against them instead.");

namespace muonps {
namespace {

absl::StatusOr<std::vector<int>> ParseGpus(const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n)) {
      return InvalidField("--gpus",
                          absl::StrCat(Quoted(part), " is not a number"));
    }
    out.push_back(n);
  }
  return out;
}

bench::SimConfig BaseConfig(std::shared_ptr<const scheduler::CostTable> costs) {
  bench::SimConfig c;
  c.gpus_per_node = absl::GetFlag(FLAGS_gpus_per_node);
  c.links.nvlink_gbs = absl::GetFlag(FLAGS_nvlink_gbs);
  c.links.inter_node_gbs = absl::GetFlag(FLAGS_inter_node_gbs);
  c.links.latency_us = absl::GetFlag(FLAGS_latency_us);
  c.links.hop_latency_us = absl::GetFlag(FLAGS_hop_latency_us);
  c.costs = std::move(costs);
  c.wire_bytes_per_element = absl::GetFlag(FLAGS_wire_bytes_per_element);
  c.gpu_memory_bytes =
      static_cast<int64_t>(absl::GetFlag(FLAGS_gpu_memory_gib) * (1 << 30));
  c.schedule.bucket_bytes = int64_t{absl::GetFlag(FLAGS_bucket_mib)} << 20;
  c.schedule.stack_bytes = int64_t{absl::GetFlag(FLAGS_stack_mib)} << 20;
  c.adamw_reference_ms = absl::GetFlag(FLAGS_adamw_reference_ms);
  c.adamw_reference_params = absl::GetFlag(FLAGS_adamw_reference_params);
  return c;
}

void Print(const nlohmann::ordered_json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

nlohmann::ordered_json StepLine(const bench::SimConfig& c,
                                scheduler::Layout layout,
                                const bench::SimResult& r) {
  nlohmann::ordered_json j;
  j["what"] = "sim_step";
  j["model"] = c.model;
  j["gpus"] = c.gpus;
  j["gpus_per_node"] = c.gpus_per_node;
  j["layout"] = std::string(scheduler::LayoutName(layout));
  j["predicted_ms"] = r.predicted_seconds * 1e3;
  j["predicted_dependencies_ms"] = r.predicted_dependencies_seconds * 1e3;
  j["compute_ms_max"] = r.compute_seconds_max * 1e3;
  j["compute_ms_mean"] = r.compute_seconds_mean * 1e3;
  j["transfer_ms_max"] = r.transfer_seconds * 1e3;
  j["latency_ms"] = r.latency_seconds * 1e3;
  j["imbalance"] = r.imbalance;
  j["owning_workers"] = r.owning_workers;
  j["transfer_phases"] = r.phases;
  j["adamw_ms"] = r.adamw_data_parallel_seconds * 1e3;
  j["ratio_vs_adamw"] = r.predicted_seconds / r.adamw_data_parallel_seconds;
  j["adamw_sharded_ms"] = r.adamw_sharded_seconds * 1e3;
  j["ratio_vs_adamw_sharded"] = r.predicted_seconds / r.adamw_sharded_seconds;
  j["ddp_allreduce_ms"] = r.allreduce_seconds * 1e3;
  if (layout == scheduler::Layout::kUnreduced) {
    j["ratio_vs_adamw_plus_allreduce"] =
        r.predicted_seconds /
        (r.adamw_data_parallel_seconds + r.allreduce_seconds);
  }
  j["bytes_per_gpu"] = r.bytes_per_gpu;
  j["parameters"] = r.parameters;
  j["plan_max_ms"] = r.plan_max_seconds * 1e3;
  j["nvlink_gbs"] = c.links.nvlink_gbs;
  j["inter_node_gbs"] = c.links.inter_node_gbs;
  j["latency_us"] = c.links.latency_us;
  j["hop_latency_us"] = c.links.hop_latency_us;
  j["cost_table_device"] = c.costs->device();
  return j;
}

absl::Status Run() {
  MUONPS_ASSIGN_OR_RETURN(
      auto costs, bench::LoadCostTable(absl::GetFlag(FLAGS_cost_table)));
  const std::vector<std::string> models =
      absl::StrSplit(absl::GetFlag(FLAGS_models), ',');
  const std::string measured = absl::GetFlag(FLAGS_measured);
  if (!measured.empty()) {
    MUONPS_ASSIGN_OR_RETURN(const std::vector<bench::MeasuredStep> steps,
                            bench::LoadMeasuredSteps(measured));
    for (const bench::MeasuredStep& m : steps) {
      bench::SimConfig c = BaseConfig(costs);
      c.model = models[0];
      c.gpus = m.gpus;
      MUONPS_ASSIGN_OR_RETURN(c.matrices,
                              bench::ModelMatrices(c.model, m.layout));
      MUONPS_ASSIGN_OR_RETURN(const bench::SimResult r, bench::SimulateStep(c));
      nlohmann::ordered_json j;
      j["what"] = "sim_validation";
      j["model"] = c.model;
      j["gpus"] = m.gpus;
      j["layout"] = std::string(scheduler::LayoutName(m.layout));
      j["predicted_ms"] = r.predicted_seconds * 1e3;
      j["measured_ms"] = m.ms;
      j["error"] = (r.predicted_seconds * 1e3 - m.ms) / m.ms;
      if (m.predicted_ms) j["bench_predicted_ms"] = *m.predicted_ms;
      j["measured_line"] = m.line;
      j["cost_table_device"] = costs->device();
      Print(j);
    }
    return absl::OkStatus();
  }
  MUONPS_ASSIGN_OR_RETURN(const std::vector<int> gpus,
                          ParseGpus(absl::GetFlag(FLAGS_gpus)));
  for (const std::string& model : models) {
    for (absl::string_view name :
         absl::StrSplit(absl::GetFlag(FLAGS_layouts), ',')) {
      MUONPS_ASSIGN_OR_RETURN(const scheduler::Layout layout,
                              bench::ParseLayout(name, "--layouts"));
      MUONPS_ASSIGN_OR_RETURN(const auto matrices,
                              bench::ModelMatrices(model, layout));
      for (const int n : gpus) {
        bench::SimConfig c = BaseConfig(costs);
        c.model = model;
        c.matrices = matrices;
        c.gpus = n;
        MUONPS_ASSIGN_OR_RETURN(const bench::SimResult r,
                                bench::SimulateStep(c));
        Print(StepLine(c, layout, r));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = muonps::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "scale_sim: %s\n", status.ToString().c_str());
    return absl::IsInvalidArgument(status) ? 2 : 1;
  }
  return 0;
}
