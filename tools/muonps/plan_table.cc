#include "tools/muonps/plan_table.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace muonps {
namespace cli {
namespace {

std::string Bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B")
                   : absl::StrFormat("%.1f %s", value, units[unit]);
}

// A worker's node (Device.node) in at most 12 characters: a boot id's
// first 12 tell the machines of a job apart; "-" for none.
std::string Node(const std::string& node) {
  return node.empty() ? "-" : node.substr(0, 12);
}

// Owners of an expert stack, compressed: "w0 x12, w1 x12".
std::string Owners(const v1::MatrixPlacement& m) {
  if (m.owners_size() == 1) return m.owners(0);
  std::map<std::string, int> counts;
  for (const std::string& owner : m.owners()) ++counts[owner];
  std::vector<std::string> parts;
  for (const auto& [owner, n] : counts)
    parts.push_back(absl::StrCat(owner, " x", n));
  return absl::StrJoin(parts, ", ");
}

}  // namespace

std::string PlanTable(const v1::Plan& plan) {
  // A placement is one tensor: a 2-D matrix or a 3-D stack of expert
  // matrices, one owner each (`muonps jobs` counts matrices too).
  int64_t matrices = 0;
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    matrices += m.owners_size();
  }
  std::string out = absl::StrFormat(
      "%s  (%s)\n%d workers on %d %s%s, %d tensors (%d matrices), %d buckets "
      "of at most %s\n"
      "predicted max %.3f ms, "
      "mean %.3f ms, imbalance %.4f, lower bound %.3f ms (max / bound %.4f)\n"
      "moved %s against the previous version; planned in %.1f ms\n",
      plan.name(), plan.reason(), plan.workers_size(),
      std::max(plan.nodes(), 1), plan.nodes() > 1 ? "nodes" : "node",
      plan.network_gbs() > 0
          ? absl::StrFormat(" (%g GB/s a worker between them)",
                            plan.network_gbs())
          : "",
      plan.matrices_size(), matrices, plan.buckets_size(),
      plan.bucket_bytes() > 0 ? Bytes(plan.bucket_bytes()) : "the job's bound",
      plan.max_seconds() * 1e3, plan.mean_seconds() * 1e3, plan.imbalance(),
      plan.lower_bound() * 1e3,
      plan.lower_bound() > 0 ? plan.max_seconds() / plan.lower_bound() : 0.0,
      Bytes(plan.moved_bytes()), plan.plan_ms());
  if (plan.owner_groups_size() > 0) {
    // Each group owns every matrix among its own workers; the placements
    // name the first group's owners.
    std::vector<std::string> groups;
    for (const v1::OwnerGroup& g : plan.owner_groups()) {
      groups.push_back(absl::StrJoin(g.workers(), " "));
    }
    absl::StrAppendFormat(
        &out,
        "owner groups: %d x %d (%s); owners below are the first group's\n",
        plan.owner_groups_size(), plan.owner_groups(0).workers_size(),
        absl::StrJoin(groups, "; "));
  }
  if (plan.exchange_nodes_size() > 0) {
    // Unreduced gradients summed within each node, then across the nodes;
    // row_sharded rows relayed through the owners' nodes.
    std::vector<std::string> nodes;
    for (const v1::NodeWorkers& n : plan.exchange_nodes()) {
      nodes.push_back(absl::StrJoin(n.workers(), " "));
    }
    absl::StrAppendFormat(&out,
                          "exchange nodes (unreduced gradients summed in two "
                          "levels, row_sharded rows relayed): %d "
                          "nodes of %d (%s)\n",
                          plan.exchange_nodes_size(),
                          plan.exchange_nodes(0).workers_size(),
                          absl::StrJoin(nodes, "; "));
  }
  if (plan.apply_at_commit()) {
    absl::StrAppend(&out,
                    "updates applied at the commit (predicted no slower than "
                    "before the votes)\n");
  }
  // Trainers that hold whole experts: the shard each rank's trainer holds
  // as the plan assumed it (its experts are owned there where possible).
  const bool shards = plan.trainer_shards() > 0;
  if (shards) {
    absl::StrAppendFormat(&out,
                          "trainers hold whole experts in %d shards; each "
                          "rank's is under SHARD\n",
                          plan.trainer_shards());
  }
  absl::StrAppendFormat(&out, "\n%-5s %-24s %12s %12s %12s %12s%s\n", "RANK",
                        "WORKER", "PREDICTED", "MOMENTUM", "MEMORY",
                        "LINK/STEP", shards ? "  SHARD" : "");
  for (int i = 0; i < plan.loads_size(); ++i) {
    const v1::WorkerLoad& l = plan.loads(i);
    const std::string shard = !shards ? ""
                              : l.trainer_shard() >= 0
                                  ? absl::StrFormat("  %5d", l.trainer_shard())
                                  : absl::StrFormat("  %5s", "-");
    absl::StrAppendFormat(&out, "%-5d %-24s %9.3f ms %12s %12s %12s%s\n", i,
                          l.worker_id(), l.predicted_seconds() * 1e3,
                          Bytes(l.momentum_bytes()), Bytes(l.memory_bytes()),
                          Bytes(l.link_bytes()), shard);
  }
  absl::StrAppendFormat(&out, "\n%-40s %-14s %-7s %s\n", "MATRIX", "SHAPE",
                        "BUCKET", "OWNER");
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    absl::StrAppendFormat(&out, "%-40s %-14s %-7d %s\n", m.name(),
                          absl::StrCat(m.rows(), "x", m.cols()), m.bucket(),
                          Owners(m));
  }
  return out;
}

std::string JobsTable(const v1::ListJobsResponse& jobs) {
  std::string out =
      absl::StrFormat("%-24s %10s %14s %8s %8s\n", "JOB", "MATRICES",
                      "PARAMETERS", "WORKERS", "PLAN");
  for (const v1::JobSummary& j : jobs.jobs()) {
    absl::StrAppendFormat(&out, "%-24s %10d %14d %8d %8d\n", j.name(),
                          j.matrices(), j.parameters(), j.workers(),
                          j.plan_version());
  }
  return out;
}

std::string WorkersTable(const v1::ListWorkersResponse& workers) {
  std::string out = absl::StrFormat(
      "%-16s %-24s %-6s %-20s %-12s %12s %10s %6s %6s %8s %12s %12s %8s\n",
      "JOB", "WORKER", "KIND", "HOST", "NODE", "MEMORY", "LEASE", "PLAN",
      "SPEED", "STEP", "COMPUTE", "PREDICTED", "ERROR");
  bool far_off = false;
  for (const v1::WorkerInfo& w : workers.workers()) {
    absl::StrAppendFormat(
        &out, "%-16s %-24s %-6s %-20s %-12s %12s %7d ms %6d %6s ", w.job(),
        w.draining() ? w.worker_id() + "(draining)" : w.worker_id(),
        w.device().kind(), w.device().host(), Node(w.device().node()),
        Bytes(w.device().memory_bytes()), w.lease_remaining_ms(),
        w.plan_version(),
        // 0: a coordinator from before measured speeds.
        w.speed_factor() > 0 ? absl::StrFormat("%.3f", w.speed_factor())
                             : std::string("-"));
    if (!w.has_last_step()) {
      absl::StrAppendFormat(&out, "%8s %12s %12s %8s\n", "-", "-", "-", "-");
      continue;
    }
    const v1::WorkerStepStats& step = w.last_step();
    const std::optional<double> error = CostModelError(step);
    absl::StrAppendFormat(
        &out, "%8d %9.3f ms %9.3f ms %8s\n", step.step(),
        step.ns_seconds() * 1e3, step.predicted_ns_seconds() * 1e3,
        error.has_value() ? absl::StrFormat("%+.1f%%", *error * 100) : "-");
    far_off = far_off || (error.has_value() && std::abs(*error) > 1.0);
  }
  if (far_off) {
    absl::StrAppend(
        &out,
        "\nERROR is measured compute against the plan's prediction. Beyond "
        "+-100% the worker's\ncost model does not describe its device (no "
        "--cost_table, or one measured elsewhere):\nmeasure one with "
        "muonps-autotune and restart the worker with --cost_table FILE.\n");
  }
  return out;
}

std::optional<double> CostModelError(const v1::WorkerStepStats& step) {
  if (!(step.predicted_ns_seconds() > 0)) return std::nullopt;
  return step.ns_seconds() / step.predicted_ns_seconds() - 1;
}

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

}  // namespace cli
}  // namespace muonps
