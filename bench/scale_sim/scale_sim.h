// A simulated clock for one muonps optimizer step on N GPUs.
//
// The ownership planner (scheduler/planner.h) and the step schedule
// (scheduler/step_schedule.h) run for real on the model's matrices and N
// colocated workers; only time is simulated, from a measured cost table
// (per shape, algorithm and batch seconds) and link figures.
//
// The plan is made as the coordinator makes it (scheduler::PlanOnTopology):
// where the workers' nodes offer owner groups
// (scheduler::ChooseOwnerGroupings: groups of 1, 2, ... whole nodes when
// every matrix is replicated and the N workers span several nodes), the
// planner runs on each grouping's first group's workers, its plan copied to
// every group (scheduler::ReplicateOverGroups), and on all N workers, and
// the shortest predicted step wins. Without groups on offer, the planner on
// all N workers, its owners dealt over the nodes (scheduler::PlanInput::
// nodes). With unreduced or row_sharded matrices on several nodes, the
// plan's schedule with exchange nodes (unreduced gradients summed in two
// levels, row_sharded rows relayed: scheduler/node_exchange.h) is weighed
// against its rings and straight gathers, the shorter taken.
//
// The clock is scheduler/step_clock.h's (what overlaps and what
// serializes, and how a phase is timed); this adds the planner's input for
// N colocated workers, `gpus_per_node` consecutive ranks per node, and the
// AdamW and all-reduce references. The schedule's bucket bound is the one
// the coordinator would choose for that topology
// (scheduler::ChooseStepGrouping) unless `schedule.bucket_bytes` is set.
//
// Functions are thread-safe (they share no state).
#ifndef MUONPS_BENCH_SCALE_SIM_SCALE_SIM_H_
#define MUONPS_BENCH_SCALE_SIM_SCALE_SIM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/cost_table.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_clock.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace bench {

using LinkFigures = scheduler::LinkFigures;

struct SimConfig {
  std::string model;  // a name for the output only
  std::vector<scheduler::MatrixSpec> matrices;
  int gpus = 0;           // N: one colocated worker per GPU
  int gpus_per_node = 8;  // G
  LinkFigures links;
  // Measured Newton-Schulz times (required; shapes it lacks fall back to
  // the cost model's roofline), multiplied by `cost_scale` (another
  // device: 176.2 / 165.3 turns the H200 table into H100 times, the ratio
  // of muonps_ns_all on one H100, bench/results/2026-11-27-h100x2-step.jsonl,
  // to one H200).
  std::shared_ptr<const scheduler::CostTable> costs;
  double cost_scale = 1.0;
  int wire_bytes_per_element = 4;
  int update_bytes_per_element = 2;
  int64_t gpu_memory_bytes = int64_t{140} << 30;
  scheduler::PlanOptions plan;
  // bucket_bytes 0: chosen as the coordinator does (the result's
  // bucket_bytes says which).
  scheduler::ScheduleOptions schedule = {.bucket_bytes = 0};
  // Fused AdamW reference: `adamw_reference_ms` for
  // `adamw_reference_params` fp32 parameters on one GPU (H200, 14.2 ms for
  // 1.74 B, shared/DEVICE.md).
  double adamw_reference_ms = 14.2;
  double adamw_reference_params = 1.74e9;
  // The commit (see the model above). HBM bytes per second for applying
  // the updates: 4.3e12 (H200; 3.0e12 on H100), nominal bandwidth less
  // what a streaming kernel reaches (not measured here). Control rounds:
  // 4 ms of fixed host cost, of which the agreement's 2.5 (before the
  // stage; ClockSettings::agreement_ms says where they were measured) and
  // the vote's the rest (in the commit).
  double hbm_bytes_per_second = 4.3e12;
  double control_rounds_ms = 4.0;
  double agreement_ms = 2.5;
  // A rank's host time per control message (ClockSettings::
  // control_message_us), for the step of the whole job: 6.3 us, measured by
  // bench/control_rounds with 512 ranks on the 16 cores of an H200 host
  // (bench/results/2026-12-03-h200-host-control-rounds.jsonl; 12 us on 2
  // cores). The messages pass along a tree of control_tree_fanout (a GPU
  // worker's: worker::kControlTreeFanout; 0: a star).
  double control_message_us = 6.3;
  int control_tree_fanout = 16;
  // Compute slowdown while transfers are in flight (see the model above);
  // 0: none.
  double transfer_contention = 0;
  // Owners write updates into the trainers' staging within a node (see
  // the model above).
  bool peer_writes = true;
  // The workers may apply the updates before the votes, where the plan's
  // clock says that is faster (scheduler::PlanWeighing::apply_at_commit),
  // as they do by default; false: always at the commit, as every measured
  // multi-GPU step so far did.
  bool apply_early = true;
  // Owner groups offered as the coordinator offers them (see above);
  // false: none, whatever the layouts and nodes.
  bool owner_groups = true;
  // Exchange nodes (unreduced gradients summed in two levels, row_sharded
  // rows relayed) where the plan predicts them shorter
  // (scheduler::ClockSettings::node_exchange); false: never.
  bool node_exchange = true;
  // HSDP (a 2-D device mesh, replicate x shard, as FSDP2 takes it): where
  // it is above 0 and below `gpus`, the GPUs form gpus / hsdp_shard_gpus
  // replica groups of this many consecutive ranks, FSDP sharding rows
  // within each. The coordinator plans such a job with one owner group per
  // replica group (required, scheduler::OwnerGroupsUse::kRequired); FSDP
  // reduces the replicas' gradients in backward, outside the step. 0 (or
  // `gpus` and more): one shard group of every GPU.
  int hsdp_shard_gpus = 0;
};

struct SimResult {
  // The step as scheduler::ClockStep clocks it (predicted_seconds, its
  // parts and critical path, per-worker compute, bytes and phases).
  scheduler::StepClock clock;
  // The schedule's bucket bound, and how the candidates clocked when it
  // was chosen (empty when set).
  int64_t bucket_bytes = 0;
  std::vector<std::pair<int64_t, double>> bucket_candidates;
  // Sum of each worker's stack times; max and mean over all N workers.
  double compute_seconds_max = 0;
  double compute_seconds_mean = 0;
  double imbalance = 1;    // max / mean compute
  int64_t parameters = 0;  // elements of all matrices
  int owning_workers = 0;  // workers that own at least one matrix
  // The plan's owner groups and the workers in each (1 and N without
  // groups).
  int owner_groups = 1;
  int group_size = 0;
  // How the plan was weighed (scheduler::PlanOnTopology's): owner groups
  // against the plan of every worker, experts where they are held against
  // where that is free, the applies before the votes against at the commit,
  // and exchange nodes against the rings; the step below says which applies
  // it took (StepClock::applies).
  scheduler::PlanWeighing weighed;
  // Where exchange nodes were offered (weighed.exchange_offered), whether
  // the plan took them; where it passed them over by their least step
  // (weighed.exchange_passed_over; weighed.exchange_seconds is that bound,
  // no shorter than the rings'), the step with them clocked here all the
  // same.
  bool exchange_taken = false;
  double exchange_clocked_seconds = 0;
  // The planner's own prediction (max worker seconds, of one group's
  // workers) for comparison.
  double plan_max_seconds = 0;
  // AdamW of the same parameters: data parallel (every GPU steps all of
  // them) and FSDP-style sharded (each GPU steps 1/N).
  double adamw_data_parallel_seconds = 0;
  double adamw_sharded_seconds = 0;
  // What DDP's all-reduce of the same gradients (at the same wire bytes,
  // one all-reduce per bucket, ring bandwidth, tree latency) costs on the
  // same links: the unreduced layout replaces it, so an unreduced step
  // compares with AdamW plus this.
  double allreduce_seconds = 0;
};

// INVALID_ARGUMENT naming the flag the field comes from (--gpus,
// --gpus_per_node, --nvlink_gbs, --inter_node_gbs, --latency_us,
// --hop_latency_us, --reduce_gbs, --cost_table, --cost_scale,
// --wire_bytes_per_element,
// --hbm_bw, --control_rounds_ms, --control_message_us, --control_tree_fanout,
// --transfer_contention,
// --copy_engine_gbs,
// --model) for
// values out of range; OK otherwise.
absl::Status ValidateSimConfig(const SimConfig& config);

// Plans, schedules and clocks one step. Errors: those of
// ValidateSimConfig, then the planner's (annotated with the workers it
// planned: one group's, with groups) and the schedule's (annotated).
absl::StatusOr<SimResult> SimulateStep(const SimConfig& config);

// Reads and parses a cost table file. INVALID_ARGUMENT naming
// --cost_table when `path` is empty, unreadable or malformed.
absl::StatusOr<std::shared_ptr<const scheduler::CostTable>> LoadCostTable(
    const std::string& path);

// The matrix sets the simulation knows, every matrix given `layout` (a
// row_sharded stack of experts sharded on its experts, as FSDP2's
// fully_shard shards a 3-D parameter; each GPU's trainer is the rank of
// its worker, so rank r holds shard r, or r % hsdp_shard_gpus):
//   llama3_8b_8layers  8 layers of Llama-3-8B (1.74 B parameters; the set
//                      the H200 measurements used)
//   llama3_8b          all 32 layers (6.98 B)
//   deepseek_v3_like   bench/plan_bench's DeepSeek-V3-like set: 61 MLA
//                      layers, 58 MoE layers of 256 routed experts
//                      (2048x7168 gate/up, 7168x2048 down, 3-D stacks)
// INVALID_ARGUMENT naming --model for other names.
absl::StatusOr<std::vector<scheduler::MatrixSpec>> ModelMatrices(
    absl::string_view model, scheduler::Layout layout);

// "replicated" | "unreduced" | "row_sharded"; INVALID_ARGUMENT naming
// `flag` otherwise.
absl::StatusOr<scheduler::Layout> ParseLayout(absl::string_view name,
                                              absl::string_view flag);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_SCALE_SIM_SCALE_SIM_H_
