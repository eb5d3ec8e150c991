// The step simulation's inputs (scale_sim.h): checking a SimConfig against
// the flags its fields come from, reading the cost table file, the named
// model matrix sets and layout names. The clock itself is in scale_sim.cc.
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/scale_sim/scale_sim.h"
#include "common/status.h"
#include "scheduler/cost_table.h"
#include "scheduler/model_shapes.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace bench {
namespace {

using scheduler::MatrixSpec;

absl::Status Positive(double value, absl::string_view flag) {
  if (!(value > 0)) {
    return InvalidField(flag, absl::StrCat(value, " must be > 0"));
  }
  return absl::OkStatus();
}

absl::Status NonNegativeFinite(double value, absl::string_view flag) {
  if (!(value >= 0) || !std::isfinite(value)) {
    return InvalidField(flag, absl::StrCat(value, " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateSimConfig(const SimConfig& config) {
  if (config.matrices.empty()) {
    return InvalidField("--model",
                        absl::StrCat(Quoted(config.model), " has no matrices"));
  }
  if (config.gpus < 1) {
    return InvalidField("--gpus", absl::StrCat(config.gpus, " must be >= 1"));
  }
  if (config.gpus_per_node < 1) {
    return InvalidField("--gpus_per_node",
                        absl::StrCat(config.gpus_per_node, " must be >= 1"));
  }
  MUONPS_RETURN_IF_ERROR(Positive(config.links.nvlink_gbs, "--nvlink_gbs"));
  MUONPS_RETURN_IF_ERROR(
      Positive(config.links.inter_node_gbs, "--inter_node_gbs"));
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(config.links.latency_us, "--latency_us"));
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(config.links.hop_latency_us, "--hop_latency_us"));
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(config.links.reduce_gbs, "--reduce_gbs"));
  if (config.costs == nullptr) {
    return InvalidField("--cost_table", "required");
  }
  if (config.hsdp_shard_gpus < 0 ||
      (config.hsdp_shard_gpus > 0 && config.hsdp_shard_gpus < config.gpus &&
       config.gpus % config.hsdp_shard_gpus != 0)) {
    return InvalidField(
        "--hsdp_shard_gpus",
        absl::StrCat(config.hsdp_shard_gpus, " must be >= 0 and divide the ",
                     config.gpus, " GPUs where it is below them"));
  }
  if (config.wire_bytes_per_element < 1) {
    return InvalidField(
        "--wire_bytes_per_element",
        absl::StrCat(config.wire_bytes_per_element, " must be >= 1"));
  }
  if (config.update_bytes_per_element < 1) {
    return InvalidField(
        "--update_bytes_per_element",
        absl::StrCat(config.update_bytes_per_element, " must be >= 1"));
  }
  MUONPS_RETURN_IF_ERROR(
      Positive(config.adamw_reference_ms, "--adamw_reference_ms"));
  MUONPS_RETURN_IF_ERROR(
      Positive(config.adamw_reference_params, "--adamw_reference_params"));
  if (!std::isfinite(config.cost_scale)) {
    return InvalidField("--cost_scale",
                        absl::StrCat(config.cost_scale, " must be finite"));
  }
  MUONPS_RETURN_IF_ERROR(Positive(config.cost_scale, "--cost_scale"));
  MUONPS_RETURN_IF_ERROR(Positive(config.hbm_bytes_per_second, "--hbm_bw"));
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(config.control_rounds_ms, "--control_rounds_ms"));
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(config.agreement_ms, "--agreement_ms"));
  if (config.agreement_ms > config.control_rounds_ms) {
    return InvalidField(
        "--agreement_ms",
        absl::StrCat(config.agreement_ms,
                     " must be at most --control_rounds_ms (",
                     config.control_rounds_ms, "), of which it is a part"));
  }
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(config.control_message_us, "--control_message_us"));
  MUONPS_RETURN_IF_ERROR(
      NonNegativeFinite(config.transfer_contention, "--transfer_contention"));
  MUONPS_RETURN_IF_ERROR(
      Positive(config.links.copy_engine_gbs, "--copy_engine_gbs"));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const scheduler::CostTable>> LoadCostTable(
    const std::string& path) {
  if (path.empty()) return InvalidField("--cost_table", "required");
  std::ifstream file(path);
  if (!file) {
    return InvalidField("--cost_table",
                        absl::StrCat("cannot read ", Quoted(path)));
  }
  std::stringstream text;
  text << file.rdbuf();
  absl::StatusOr<scheduler::CostTable> table =
      scheduler::CostTable::Parse(text.str());
  if (!table.ok()) {
    return InvalidField("--cost_table", absl::StrCat(Quoted(path), ": ",
                                                     table.status().message()));
  }
  return std::make_shared<const scheduler::CostTable>(*std::move(table));
}

absl::StatusOr<std::vector<MatrixSpec>> ModelMatrices(
    absl::string_view model, scheduler::Layout layout) {
  std::vector<MatrixSpec> out;
  if (model == "llama3_8b_8layers") {
    out = scheduler::Llama3_8B(8);
  } else if (model == "llama3_8b") {
    out = scheduler::Llama3_8B(32);
  } else if (model == "deepseek_v3_like") {
    out = scheduler::DeepSeekV3Like();
  } else {
    return InvalidField("--model",
                        absl::StrCat(Quoted(model),
                                     " is not llama3_8b_8layers, llama3_8b or "
                                     "deepseek_v3_like"));
  }
  for (MatrixSpec& m : out) {
    m.layout = layout;
    // FSDP2's fully_shard shards a 3-D parameter on its first dimension:
    // each rank holds whole experts.
    m.shard_experts = layout == scheduler::Layout::kRowSharded && m.experts > 1;
  }
  return out;
}

absl::StatusOr<scheduler::Layout> ParseLayout(absl::string_view name,
                                              absl::string_view flag) {
  for (const scheduler::Layout layout :
       {scheduler::Layout::kReplicated, scheduler::Layout::kUnreduced,
        scheduler::Layout::kRowSharded}) {
    if (name == scheduler::LayoutName(layout)) return layout;
  }
  return InvalidField(flag, absl::StrCat(Quoted(name),
                                         " is not replicated, unreduced or "
                                         "row_sharded"));
}

}  // namespace bench
}  // namespace muonps
