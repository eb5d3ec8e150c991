// scale_sim: predicts a muonps optimizer step on 64-1024 GPUs.
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
//    "limited_by":..,"owner_groups":..,"group_size":..,"agreed_ms":..,
//    "stage_ms":..,"commit_ms":..,"critical_compute_ms":..,
//    "critical_wait_ms":..,"updates_tail_ms":..,"adamw_ms":..,
//    "ratio_vs_adamw":..,"bytes_per_gpu":..,...}
// predicted_ms = stage_ms + commit_ms (scale_sim.h's clock of the worker:
// the agreement, ending at agreed_ms, which a worker's first stack of
// replicated gradients may compute beside; all gradients first, each stack
// after its own bucket, updates back after the compute issued before them;
// the stage ends at stage_ms from the step's start); the critical path parts
// (critical_compute_ms + critical_wait_ms + updates_tail_ms + commit_ms)
// add up to it and limited_by names the largest.
// transfer_ms_max: every worker takes part in every phase of its owner
// group, so it is the busy time of the one transfer timeline (latency_ms
// of it is latency).
// experts_at_holders, at_holders_ms, where_free_ms: with row_sharded
// stacks of experts (each GPU's trainer holding whole experts, as FSDP2
// shards a 3-D parameter), the step with every expert owned where it is
// held and with experts there only where that costs no worker more
// Newton-Schulz; the faster is taken.
// applied_before_votes, before_votes_ms, at_commit_ms: among several
// workers without owner groups, the step with every update applied before
// the votes and at the commit, as the plan weighs them (without the
// control tree's messages), and whether the step above was clocked with
// them before the votes (the faster, and --apply_early).
// exchange_taken, exchange_ms, rings_ms: with unreduced or row_sharded
// matrices on several nodes of as many GPUs, the plan's step with exchange
// nodes (unreduced gradients summed within each node, then across the
// nodes among the GPUs of one position; row_sharded rows through the relay
// at their position on the owner's node: scheduler/node_exchange.h) and
// without (a ring per unreduced matrix, rows straight to their owner),
// each with its own bucket bound, and whether the exchange nodes were
// taken (the shorter). exchange_passed_over, exchange_least_ms: the plan
// did not schedule the exchange, its least step (its launches, its busier
// link's levels and its HBM time for every unreduced element) being no
// shorter than the rings' step; exchange_ms is then clocked by this program
// alone.
// owner_groups, group_size: the plan's owner groups and the workers in
// each, chosen as the coordinator chooses them (groups of 1, 2, ... whole
// nodes when every matrix is replicated and N spans several nodes, each
// clocked in group_candidates, the shortest step taken where it beats
// ungrouped_ms; else 1 and N): the planner plans one group's workers and
// each group owns every matrix. ungrouped_passed_over: that plan was not
// made, since the best grouping predicted no more than its least step
// (ungrouped_ms is that bound).
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
//    "measured_ms":..,"error":(predicted - measured) / measured,
//    "predicted_gradients_landed_ms":..,"measured_gradients_landed_ms":..,
//    ... compute_end_ms_max, stage_ms, agreed_ms, commit_ms likewise}
// (measured parts from the file's muonps_step_timeline lines: the latest
// mark over the ranks, since each rank's stage began; agreed_ms is the
// host's agreement from the step's start, commit_ms its vote, apply and
// release from the last rank's stage: each the latest rank's),
// then per timeline line
//   {"what":"sim_validation_worker","rank":..,"predicted_compute_end_ms":..,
//    "measured_compute_end_ms":..,"error":..,"same_stacks":..}
// For H100 runs pass the H100 settings: --cost_scale=1.06594 (176.2 /
// 165.3, muonps_ns_all on one H100 over one H200) --hbm_bw=3.0e12
// --gpu_memory_gib=80 and --nvlink_gbs the measured NCCL bus bandwidth.
//
// Commit flags (the commit is a fixed cost per step, scale_sim.h):
//   --hbm_bw             B/s applying the updates (8 B of fp32 parameter
//                        plus the update's bytes per parameter a trainer
//                        holds); default 4.3e12 (H200; H100 3.0e12)
//   --control_message_us a rank's time per control message, on top: the
//                        busiest path's messages a round, for the 2 rounds
//                        the trainer waits for (agree, vote; the confirm
//                        follows its release: scheduler::
//                        kControlRoundsAwaited);
//                        default 6.3 (bench/control_rounds, 512 ranks on
//                        16 cores)
//   --control_tree_fanout  the tree the control messages pass along; default
//                        16 (a GPU worker's), 0 a star around rank 0
//   --control_rounds_ms  the rounds' fixed host cost a step (none for one
//                        GPU: scheduler::ControlSeconds); default 4 (the
//                        2-GPU validations hold with 2.5 to 4)
//   --agreement_ms       of it, the agreement's, before the stage: every
//                        transfer and stack waits for it, but a stack
//                        computed ahead of it (a worker's first, of
//                        replicated gradients read in place); the vote's,
//                        the rest, is in the commit; default 2.5 (two
//                        H200s over TCP, host_ms.agreed 2.3-2.8 ms where
//                        nothing computes ahead, median 2.5)
//   --cost_scale         multiplies the cost table's times; default 1
//   --transfer_contention  compute runs 1 + this times slower while a
//                        transfer phase is in flight; default 0
// Link flags:
//   --nvlink_gbs      per GPU per direction among one node's GPUs; default
//                     300, the NCCL all-to-all bus bandwidth among 4 H200s
//   --inter_node_gbs  each GPU's NIC; default 50 (a 400 Gb/s port; not
//                     measured)
//   --latency_us      per collective; default 8.4 } NCCL's tuning model for
//   --hop_latency_us  per ring hop; default 3.4   } ring/Simple (not measured)
//   --reduce_gbs      NVLink rate of a reduce's ring; default 0: nvlink_gbs
//   --peer_writes     owners write updates into the trainers' staging
//                     within a node (copy engines); default true
//   --apply_early     the workers may apply the updates before the votes,
//                     on their compute streams once their stacks are done,
//                     where the plan's clock says that is faster (their
//                     default; not measured on several GPUs); default
//                     true (false: always at the commit, as the measured
//                     steps did)
//   --owner_groups    owner groups as the coordinator chooses them;
//                     default true (false: one group of every worker)
//   --node_exchange   unreduced gradients by the two-level exchange and
//                     row_sharded rows through relays, where the plan
//                     predicts it shorter; default true (false: always
//                     the rings and straight gathers)
//   --hsdp_shard_gpus HSDP: GPUs per shard group; the GPUs form replica
//                     groups of this many consecutive ranks, each planned
//                     as one owner group (as the coordinator plans a job of
//                     replica groups); default 0 (FSDP over every GPU)
//   --copy_engine_gbs one stream of peer copies; default 198 (measured on
//                     2 H200s, 2026-11-29 transfer_paths peer_copy)
// Exits 2 with the error on stderr for bad flags (INVALID_ARGUMENT naming
// the flag), 1 for other failures.
#include <algorithm>
#include <cstdio>
#include <memory>
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
ABSL_FLAG(double, reduce_gbs, 0,
          "NVLink GB/s of a reduce's ring (0: --nvlink_gbs).");
ABSL_FLAG(bool, peer_writes, true,
          "Owners write updates into the trainers' staging within a node.");
ABSL_FLAG(bool, apply_early, true,
          "The workers may apply the updates before the votes where the "
          "plan's clock says that is faster (false: always at the commit, "
          "as every measured multi-GPU step did).");
ABSL_FLAG(bool, owner_groups, true,
          "Owner groups as the coordinator chooses them (one per node for "
          "replicated jobs across nodes); false: one group of every worker.");
ABSL_FLAG(bool, node_exchange, true,
          "Unreduced gradients summed within each node, then across the "
          "nodes, and row_sharded rows relayed through the owners' nodes, "
          "where the plan predicts it shorter; false: always the rings and "
          "straight gathers.");
ABSL_FLAG(int, hsdp_shard_gpus, 0,
          "HSDP: GPUs per shard group (replica groups of this many "
          "consecutive ranks, one owner group each); 0: FSDP over every GPU.");
ABSL_FLAG(double, copy_engine_gbs, 198,
          "GB/s of one stream of peer copies into another GPU of the node.");
ABSL_FLAG(std::string, cost_table, "",
          "Measured Newton-Schulz times (scheduler/cost_table.h format).");
ABSL_FLAG(int, wire_bytes_per_element, 4,
          "Bytes per gradient element on the wire (the worker sends fp32).");
ABSL_FLAG(int, update_bytes_per_element, 2,
          "Bytes per update element on the wire and in the apply (bf16: the "
          "precision Newton-Schulz ran in; 4 for --precision fp32).");
ABSL_FLAG(double, gpu_memory_gib, 140, "Memory per GPU for the planner.");
ABSL_FLAG(int, bucket_mib, 0,
          "Step schedule bucket size (MiB); 0: chosen as the coordinator "
          "does for the topology.");
ABSL_FLAG(int, stack_mib, 1024, "Step schedule stack size (MiB, fp32).");
ABSL_FLAG(double, adamw_reference_ms, 14.2,
          "Fused AdamW ms for --adamw_reference_params on one GPU.");
ABSL_FLAG(double, adamw_reference_params, 1.74e9,
          "Parameters of the AdamW reference.");
ABSL_FLAG(double, cost_scale, 1.0,
          "Multiplies the cost table's times (H200 table to H100: "
          "176.2/165.3).");
ABSL_FLAG(double, hbm_bw, 4.3e12,
          "HBM bytes/s for applying updates (H200 4.3e12; H100 3.0e12).");
ABSL_FLAG(double, control_rounds_ms, 4.0,
          "The control rounds' fixed host cost per step (ms).");
ABSL_FLAG(double, agreement_ms, 2.5,
          "Of --control_rounds_ms, the agreement's (ms): before the stage, "
          "where stacks computed ahead of it may hide it; the rest is the "
          "vote's, in the commit.");
ABSL_FLAG(double, control_message_us, 6.3,
          "A rank's host time per control message (us): each round passes "
          "those of its busiest path along the control tree.");
ABSL_FLAG(int, control_tree_fanout, 16,
          "Fanout of the tree the control messages pass along (0: a star).");
ABSL_FLAG(double, transfer_contention, 0,
          "Compute runs 1 + this times slower while transfers are in flight.");
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
  c.links.reduce_gbs = absl::GetFlag(FLAGS_reduce_gbs);
  c.links.copy_engine_gbs = absl::GetFlag(FLAGS_copy_engine_gbs);
  c.peer_writes = absl::GetFlag(FLAGS_peer_writes);
  c.apply_early = absl::GetFlag(FLAGS_apply_early);
  c.owner_groups = absl::GetFlag(FLAGS_owner_groups);
  c.node_exchange = absl::GetFlag(FLAGS_node_exchange);
  c.hsdp_shard_gpus = absl::GetFlag(FLAGS_hsdp_shard_gpus);
  c.costs = std::move(costs);
  c.cost_scale = absl::GetFlag(FLAGS_cost_scale);
  c.hbm_bytes_per_second = absl::GetFlag(FLAGS_hbm_bw);
  c.control_rounds_ms = absl::GetFlag(FLAGS_control_rounds_ms);
  c.agreement_ms = absl::GetFlag(FLAGS_agreement_ms);
  c.control_message_us = absl::GetFlag(FLAGS_control_message_us);
  c.control_tree_fanout = absl::GetFlag(FLAGS_control_tree_fanout);
  c.transfer_contention = absl::GetFlag(FLAGS_transfer_contention);
  c.wire_bytes_per_element = absl::GetFlag(FLAGS_wire_bytes_per_element);
  c.update_bytes_per_element = absl::GetFlag(FLAGS_update_bytes_per_element);
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

// The settings of `c` every line that reports a simulated step carries.
void AddSettings(const bench::SimConfig& c, nlohmann::ordered_json* j) {
  (*j)["nvlink_gbs"] = c.links.nvlink_gbs;
  (*j)["reduce_gbs"] = c.links.reduce_gbs;
  (*j)["cost_table_device"] = c.costs->device();
  (*j)["cost_scale"] = c.cost_scale;
  (*j)["hbm_bw"] = c.hbm_bytes_per_second;
  (*j)["control_rounds_ms"] = c.control_rounds_ms;
  (*j)["agreement_ms"] = c.agreement_ms;
  (*j)["control_message_us"] = c.control_message_us;
  (*j)["control_tree_fanout"] = c.control_tree_fanout;
  (*j)["transfer_contention"] = c.transfer_contention;
  (*j)["peer_writes"] = c.peer_writes;
  (*j)["apply_early"] = c.apply_early;
  (*j)["node_exchange"] = c.node_exchange;
  (*j)["copy_engine_gbs"] = c.links.copy_engine_gbs;
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
  j["predicted_ms"] = r.clock.predicted_seconds * 1e3;
  j["limited_by"] = r.clock.limited_by;
  j["owner_groups"] = r.owner_groups;
  j["group_size"] = r.group_size;
  if (c.hsdp_shard_gpus > 0) j["hsdp_shard_gpus"] = c.hsdp_shard_gpus;
  const scheduler::PlanWeighing& w = r.weighed;
  if (w.ungrouped_seconds > 0) {
    j["grouped_ms"] = w.grouped_seconds * 1e3;
    j["ungrouped_ms"] = w.ungrouped_seconds * 1e3;
    if (w.ungrouped_passed_over) j["ungrouped_passed_over"] = true;
    nlohmann::ordered_json tried = nlohmann::ordered_json::array();
    for (const auto& [members, seconds] : w.grouped_candidates) {
      tried.push_back(
          {{"group_size", members}, {"predicted_ms", seconds * 1e3}});
    }
    j["group_candidates"] = tried;
    if (!w.groups_declined.empty()) j["groups_declined"] = w.groups_declined;
  }
  if (w.before_votes_seconds > 0) {
    j["applied_before_votes"] = r.clock.applies.before_votes;
    j["before_votes_ms"] = w.before_votes_seconds * 1e3;
    j["at_commit_ms"] = w.at_commit_seconds * 1e3;
  }
  if (w.exchange_offered) {
    j["exchange_taken"] = r.exchange_taken;
    // Passed over: the plan's exchange_seconds is the least step, and the
    // step with the exchange is the one clocked here.
    j["exchange_ms"] = (w.exchange_passed_over ? r.exchange_clocked_seconds
                                               : w.exchange_seconds) *
                       1e3;
    j["rings_ms"] = w.rings_seconds * 1e3;
    if (w.exchange_passed_over) {
      j["exchange_passed_over"] = true;
      j["exchange_least_ms"] = w.exchange_seconds * 1e3;
    }
    if (!w.exchange_declined.empty()) {
      j["exchange_declined"] = w.exchange_declined;
    }
  }
  if (w.at_holders_seconds > 0) {
    j["experts_at_holders"] = w.experts_at_holders;
    j["at_holders_ms"] = w.at_holders_seconds * 1e3;
    j["where_free_ms"] = w.where_free_seconds * 1e3;
  }
  j["bucket_bytes"] = r.bucket_bytes;
  if (!r.bucket_candidates.empty()) {
    nlohmann::ordered_json tried = nlohmann::ordered_json::array();
    for (const auto& [bytes, seconds] : r.bucket_candidates) {
      tried.push_back(
          {{"bucket_bytes", bytes}, {"predicted_ms", seconds * 1e3}});
    }
    j["bucket_candidates"] = std::move(tried);
  }
  j["agreed_ms"] = r.clock.agreement_seconds * 1e3;
  j["stage_ms"] = r.clock.stage_seconds * 1e3;
  j["commit_ms"] = r.clock.commit_seconds * 1e3;
  j["apply_ms"] = r.clock.apply_seconds * 1e3;
  j["critical_compute_ms"] = r.clock.critical_compute_seconds * 1e3;
  j["critical_wait_ms"] = r.clock.critical_wait_seconds * 1e3;
  j["updates_tail_ms"] = r.clock.updates_tail_seconds * 1e3;
  j["gradients_landed_ms"] = r.clock.gradients_landed_seconds * 1e3;
  j["compute_end_ms_max"] = r.clock.compute_end_seconds_max * 1e3;
  j["compute_ms_max"] = r.compute_seconds_max * 1e3;
  j["compute_ms_mean"] = r.compute_seconds_mean * 1e3;
  j["transfer_ms_max"] = r.clock.transfer_seconds * 1e3;
  j["latency_ms"] = r.clock.latency_seconds * 1e3;
  j["imbalance"] = r.imbalance;
  j["owning_workers"] = r.owning_workers;
  j["transfer_phases"] = r.clock.phases;
  j["adamw_ms"] = r.adamw_data_parallel_seconds * 1e3;
  j["ratio_vs_adamw"] =
      r.clock.predicted_seconds / r.adamw_data_parallel_seconds;
  j["adamw_sharded_ms"] = r.adamw_sharded_seconds * 1e3;
  j["ratio_vs_adamw_sharded"] =
      r.clock.predicted_seconds / r.adamw_sharded_seconds;
  j["ddp_allreduce_ms"] = r.allreduce_seconds * 1e3;
  if (layout == scheduler::Layout::kUnreduced) {
    j["ratio_vs_adamw_plus_allreduce"] =
        r.clock.predicted_seconds /
        (r.adamw_data_parallel_seconds + r.allreduce_seconds);
  }
  j["bytes_per_gpu"] = r.clock.bytes_per_gpu;
  j["parameters"] = r.parameters;
  j["plan_max_ms"] = r.plan_max_seconds * 1e3;
  j["inter_node_gbs"] = c.links.inter_node_gbs;
  j["latency_us"] = c.links.latency_us;
  j["hop_latency_us"] = c.links.hop_latency_us;
  AddSettings(c, &j);
  return j;
}

double Error(double predicted, double measured) {
  return (predicted - measured) / measured;
}

// One sim_validation line per measured step (with the timelines' means and
// maxima of the same N and layout), then one sim_validation_worker line
// per timeline: that rank's compute end against the simulated worker of
// the same rank, and whether both compute the same stacks.
absl::Status Validate(
    const std::string& path, const std::string& model,
    const std::shared_ptr<const scheduler::CostTable>& costs) {
  MUONPS_ASSIGN_OR_RETURN(const std::vector<bench::MeasuredStep> steps,
                          bench::LoadMeasuredSteps(path));
  MUONPS_ASSIGN_OR_RETURN(const std::vector<bench::MeasuredTimeline> timelines,
                          bench::LoadMeasuredTimelines(path));
  for (const bench::MeasuredStep& m : steps) {
    bench::SimConfig c = BaseConfig(costs);
    c.model = model;
    c.gpus = m.gpus;
    MUONPS_ASSIGN_OR_RETURN(c.matrices,
                            bench::ModelMatrices(c.model, m.layout));
    MUONPS_ASSIGN_OR_RETURN(const bench::SimResult r, bench::SimulateStep(c));
    const std::string layout(scheduler::LayoutName(m.layout));
    nlohmann::ordered_json j;
    j["what"] = "sim_validation";
    j["model"] = c.model;
    j["gpus"] = m.gpus;
    j["layout"] = layout;
    j["predicted_ms"] = r.clock.predicted_seconds * 1e3;
    j["measured_ms"] = m.ms;
    j["error"] = Error(r.clock.predicted_seconds * 1e3, m.ms);
    j["limited_by"] = r.clock.limited_by;
    // Parts, predicted and measured: device ms since the stage began (a
    // worker's first mark: before the agreement where it computes a stack
    // ahead of it, else after it; measured: the latest over the ranks'
    // timelines), and the host's agreement (from the step's start, the
    // latest rank's) and commit (from the last rank's stage to the last
    // rank's commit: the vote, the apply, the release).
    double landed = 0, compute_end = 0, stage = 0, agreed = 0, staged = 0,
           committed = 0;
    int ranks = 0;
    for (const bench::MeasuredTimeline& t : timelines) {
      if (t.gpus != m.gpus || t.workers != 1 || t.layout != m.layout) {
        continue;
      }
      ++ranks;
      landed = std::max(landed, t.gradients_landed_ms);
      compute_end = std::max(compute_end, t.compute_end_ms);
      stage = std::max({stage, t.compute_end_ms, t.updates_landed_ms});
      agreed = std::max(agreed, t.agreed_ms);
      staged = std::max(staged, t.staged_ms);
      committed = std::max(committed, t.committed_ms);
    }
    const std::vector<double>& begins = r.clock.worker_stage_begin_seconds;
    const double begin = *std::min_element(begins.begin(), begins.end());
    j["predicted_gradients_landed_ms"] =
        (r.clock.gradients_landed_seconds - begin) * 1e3;
    j["predicted_compute_end_ms_max"] =
        (r.clock.compute_end_seconds_max - begin) * 1e3;
    j["predicted_stage_ms"] = (r.clock.stage_seconds - begin) * 1e3;
    j["predicted_agreed_ms"] = r.clock.agreement_seconds * 1e3;
    j["predicted_commit_ms"] = r.clock.commit_seconds * 1e3;
    if (ranks > 0) {
      j["measured_gradients_landed_ms"] = landed;
      j["measured_compute_end_ms_max"] = compute_end;
      j["measured_stage_ms"] = stage;
      j["measured_agreed_ms"] = agreed;
      j["measured_commit_ms"] = committed - staged;
      j["timeline_ranks"] = ranks;
    }
    if (m.predicted_ms) j["bench_predicted_ms"] = *m.predicted_ms;
    j["measured_line"] = m.line;
    AddSettings(c, &j);
    Print(j);
    for (const bench::MeasuredTimeline& t : timelines) {
      if (t.gpus != m.gpus || t.workers != 1 || t.layout != m.layout ||
          t.rank >= m.gpus) {
        continue;
      }
      nlohmann::ordered_json w;
      w["what"] = "sim_validation_worker";
      w["gpus"] = m.gpus;
      w["layout"] = layout;
      w["rank"] = t.rank;
      const double predicted = (r.clock.worker_compute_end_seconds[t.rank] -
                                r.clock.worker_stage_begin_seconds[t.rank]) *
                               1e3;
      w["predicted_compute_end_ms"] = predicted;
      w["measured_compute_end_ms"] = t.compute_end_ms;
      if (t.compute_end_ms > 0) {
        w["error"] = Error(predicted, t.compute_end_ms);
      }
      w["predicted_compute_ms"] = r.clock.worker_compute_seconds[t.rank] * 1e3;
      w["predicted_stacks"] = r.clock.worker_stacks[t.rank];
      w["measured_stacks"] = t.stacks;
      w["same_stacks"] = r.clock.worker_stacks[t.rank] == t.stacks;
      w["measured_line"] = t.line;
      Print(w);
    }
  }
  return absl::OkStatus();
}

absl::Status Run() {
  MUONPS_ASSIGN_OR_RETURN(
      auto costs, bench::LoadCostTable(absl::GetFlag(FLAGS_cost_table)));
  const std::vector<std::string> models =
      absl::StrSplit(absl::GetFlag(FLAGS_models), ',');
  const std::string measured = absl::GetFlag(FLAGS_measured);
  if (!measured.empty()) return Validate(measured, models[0], costs);
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
