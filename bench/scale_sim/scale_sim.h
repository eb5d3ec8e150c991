// A simulated clock for one muonps optimizer step on N GPUs.
//
// The ownership planner (scheduler/planner.h) and the step schedule
// (scheduler/step_schedule.h) run for real on the model's matrices and N
// colocated workers; only time is simulated, from a measured cost table
// (per shape, algorithm and batch seconds) and link figures.
//
// The clock model follows what a worker does (server/worker/step_run.cc,
// StepRun::Stage):
// - Two streams per worker. Every phase that moves data (a bucket's
//   gradients to owners, or its updates back) is one grouped NCCL launch
//   among all N workers, issued in the same order on every rank, so it
//   starts on every worker at once (when the last rank reaches it) and
//   ends at once: the transfer streams form one global timeline.
// - Every bucket's gradients-to-owners phase is issued first, in the
//   schedule's order, back to back from time 0 (gradients are all ready
//   when the step starts, after backward). A bucket's gradients have
//   landed when its phase ends (a bucket without such transfers: when the
//   previous one's did; none at all, as with replicated gradients: at 0).
// - A stack's momentum + Newton-Schulz runs on its owner's compute stream
//   in the schedule's order, once the bucket that completes it
//   (OwnerStack::ready_bucket) has landed; its Newton-Schulz takes one
//   call per chunk (OwnerStack::chunks: the plan's batch split, if any).
//   Compute never waits for updates going back, nor for other workers.
//   While a transfer phase is in flight, a worker's compute runs
//   1 + `transfer_contention` times slower: NCCL's kernels hold SMs and
//   their copies HBM bandwidth that the GEMMs would use (the workers'
//   muonps_worker_step_compute_seconds against the plan's prediction
//   measures it).
// - The updates-back phases follow on the transfer stream, after all the
//   gradients. Before each, every worker's transfer stream waits for all
//   compute that worker has issued so far (the stacks before the phase in
//   the order); the collective starts when the last rank gets there, so it
//   starts at max(previous phase's end, every worker's compute so far).
// - The stage ends when the last update has landed and every compute
//   stream is done. Then the commit, a fixed cost per step: the control
//   rounds (agree, vote, confirm: `control_rounds_ms`) plus applying the
//   staged updates to the trainer's fp32 parameters, memory bound at 8
//   bytes of parameter read and written plus the update's bytes per
//   parameter the worker's trainer holds (all of them; 1/N of a
//   row-sharded matrix's rows) over `hbm_bytes_per_second`.
//   Momentum, scaling and AdamW of non-matrix parameters are not timed
//   (the cost table is Newton-Schulz only).
// - Peer writes (server/worker/staging_windows.h): when every GPU is on
//   one node and every trainer keeps every parameter whole (no
//   row-sharded matrix), an owner copies each update into every other
//   trainer's staging with the copy engines instead of a collective: its
//   updates-back phases run on its own transfer stream, each after the
//   owner's compute issued before it, at `copy_engine_gbs` per owner (its
//   (N-1) copies one after another), and slow no compute. Otherwise the
//   updates go by the collectives above.
// - So the step is limited by one of: a worker's compute, its wait for
//   its gradients (transfer bound), the updates still going back after the
//   last compute ends (transfer bound), or the commit.
//
// Phase time = message latency + ring fill + bandwidth term:
// - each collective (reduce, broadcast) or point-to-point batch of the
//   phase costs `latency_us`; a phase with a ring collective (NCCL has
//   only rings for reduce and broadcast) pays `hop_latency_us` per hop of
//   the N-1 hop ring once (the group's collectives pipeline behind one
//   another). Defaults are NCCL's own tuning model for ring/Simple.
// - bytes on the wire are `wire_bytes_per_element` per element of a
//   gradient (the worker widens bf16 gradients to fp32 before sending) and
//   `update_bytes_per_element` of an update (it leaves the owner in the
//   precision Newton-Schulz ran in: 2 for bf16). A reduce or broadcast
//   moves the matrix's S bytes through every rank (ring): within one node
//   over NVLink; across nodes S (G-1)/G over NVLink and S/G over each GPU's
//   NIC (NCCL spreads its rings' node crossings over the G NICs). A row
//   gather moves S/N from each rank to the owner (S (N-1)/N into it), a
//   row scatter the reverse; off-node parts go over the owner's own NIC.
//   The phase's bandwidth term is the slowest rank's
//   max(NVLink bytes / nvlink rate, NIC bytes / NIC rate), with bytes per
//   rank the larger of sent and received.
//
// Functions are thread-safe (they share no state).
#ifndef MUONPS_BENCH_SCALE_SIM_SCALE_SIM_H_
#define MUONPS_BENCH_SCALE_SIM_SCALE_SIM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/cost_table.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace bench {

// Link figures per GPU, per direction. Defaults: NVLink is the NCCL
// all-to-all bus bandwidth measured among 4 H200s (shared/DEVICE.md); the
// NIC is one 400 Gb/s port per GPU (not measured); latencies are NCCL's
// tuning model for ring/Simple (not measured).
struct LinkFigures {
  double nvlink_gbs = 300;      // among the GPUs of one node
  double inter_node_gbs = 50;   // each GPU's network port
  double latency_us = 8.4;      // per collective or point-to-point batch
  double hop_latency_us = 3.4;  // per ring hop, once per phase
  // NVLink rate of a reduce's ring (NCCL also sums on the way); 0: the
  // same as nvlink_gbs.
  double reduce_gbs = 0;
  // One stream of peer copies (copy engines) into another GPU of the
  // node: 198 GB/s for the bf16 updates on 2 H200s
  // (bench/results/2026-11-29-h200x2-transfer-paths.jsonl, peer_copy).
  double copy_engine_gbs = 198;
};

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
  scheduler::ScheduleOptions schedule;
  // Fused AdamW reference: `adamw_reference_ms` for
  // `adamw_reference_params` fp32 parameters on one GPU (H200, 14.2 ms for
  // 1.74 B, shared/DEVICE.md).
  double adamw_reference_ms = 14.2;
  double adamw_reference_params = 1.74e9;
  // The commit (see the model above). HBM bytes per second for applying
  // the updates: 4.3e12 (H200; 3.0e12 on H100), nominal bandwidth less
  // what a streaming kernel reaches (not measured here). Control rounds:
  // 4 ms, the agree round the H100 timelines show (host_ms.agreed, 2.3 to
  // 4.3 ms) plus their vote and confirm.
  double hbm_bytes_per_second = 4.3e12;
  double control_rounds_ms = 4.0;
  // Compute slowdown while transfers are in flight (see the model above);
  // 0: none.
  double transfer_contention = 0;
  // Owners write updates into the trainers' staging within a node (see
  // the model above).
  bool peer_writes = true;
};

struct SimResult {
  // The step: stage_seconds + commit_seconds.
  double predicted_seconds = 0;
  // Every update has landed and every compute stream is done.
  double stage_seconds = 0;
  // Control rounds + apply (apply_seconds).
  double commit_seconds = 0;
  double apply_seconds = 0;
  // The last bucket's gradients have landed (0 with none to move).
  double gradients_landed_seconds = 0;
  // Sum of each worker's stack times; max and mean over all N workers.
  double compute_seconds_max = 0;
  double compute_seconds_mean = 0;
  double imbalance = 1;  // max / mean compute
  // When each worker's compute stream is done (0 for a worker that owns
  // nothing), and the latest of them.
  std::vector<double> worker_compute_end_seconds;
  double compute_end_seconds_max = 0;
  // The step's critical path, in four parts that add up to
  // predicted_seconds: the compute of the worker whose compute ends last,
  // the time its compute stream waited for gradients, the updates still
  // going back after that (stage_seconds - compute_end_seconds_max), and
  // the commit. `limited_by` names the largest: "compute", "gradients",
  // "updates_back" or "commit".
  double critical_compute_seconds = 0;
  double critical_wait_seconds = 0;
  double updates_tail_seconds = 0;
  std::string limited_by;
  // Busy time of the transfer timeline, and the latency part of it.
  double transfer_seconds = 0;
  double latency_seconds = 0;
  // Largest per-GPU wire bytes of the step (max of sent and received).
  int64_t bytes_per_gpu = 0;
  int64_t parameters = 0;  // elements of all matrices
  int owning_workers = 0;  // workers that own at least one matrix
  int phases = 0;          // transfer phases with at least one transfer
  // The planner's own prediction (max worker seconds) for comparison.
  double plan_max_seconds = 0;
  std::vector<double> worker_compute_seconds;
  // The stacks (StepSchedule::stacks indices) each worker computes, in
  // the order it runs them.
  std::vector<std::vector<int>> worker_stacks;
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
// --hbm_bw, --control_rounds_ms, --transfer_contention, --copy_engine_gbs,
// --model) for
// values out of range; OK otherwise.
absl::Status ValidateSimConfig(const SimConfig& config);

// Plans, schedules and clocks one step. Errors: those of
// ValidateSimConfig, then the planner's and the schedule's (annotated).
absl::StatusOr<SimResult> SimulateStep(const SimConfig& config);

// Reads and parses a cost table file. INVALID_ARGUMENT naming
// --cost_table when `path` is empty, unreadable or malformed.
absl::StatusOr<std::shared_ptr<const scheduler::CostTable>> LoadCostTable(
    const std::string& path);

// The matrix sets the simulation knows, every matrix given `layout`:
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
