// step_gpu_bench's multi-GPU run: trainer rank r of N (one process per
// rank, all started together) lends the Llama matrix set on GPU r to the
// muonps-worker on that GPU by CUDA IPC, in one layout, and times its own
// steps; the workers move tensors among themselves over NCCL. Rank 0
// prints (JSON lines):
//   muonps_step_<N>gpu  its median step, with ratios against the one-GPU
//                       run and the torch peers (torch_peers.py
//                       --owner_world N) measured in the same script
//   muonps_bytes_sent_per_step  per worker: the bytes its transport sent
//                       per step (muonps_worker_transport_bytes_sent_total,
//                       scraped before and after), against what one rank of
//                       a ring all-reduce of the same fp32 gradients sends
//   muonps_plan_worker  per worker: the plan's prediction and batches
//                       (GetPlan)
//   muonps_cost_model_worker  per worker: its last step's compute time
//                       (muonps_worker_step_compute_seconds, CUDA events)
//                       against the plan's prediction of it
// every other rank a muonps_step_<N>gpu_rank line with its own median, and
// every rank a muonps_step_<N>gpu_clock line: each step's Step call and
// parameters seen, in ms on the steady clock, to set beside the workers'
// timelines (their began_at_ms).
#ifndef MUONPS_BENCH_STEP_GPU_RANKS_STEP_H_
#define MUONPS_BENCH_STEP_GPU_RANKS_STEP_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "bench/step_gpu/llama_matrices.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace bench {

struct RanksStepOptions {
  std::string coordinator;    // HOST:PORT
  std::string job;            // the same on every rank
  std::string worker_socket;  // the worker on this rank's GPU
  int rank = 0;               // trainer rank, and its CUDA device
  int ranks = 2;              // trainers (and their workers), >= 2
  // Workers with no trainer (muonps-worker --dedicated) beside them, ranked
  // after the trainers' workers: a dedicated optimizer pool.
  int dedicated_workers = 0;
  scheduler::Layout layout = scheduler::Layout::kReplicated;
  MatrixSet matrices;  // full shapes
  int warmup = 3;
  int repeats = 10;
  std::string torch_results;       // torch_peers.py's lines (may be empty)
  std::string one_worker_results;  // the one-GPU run's lines (may be empty)
  // Rank 0: each worker's /metrics as HOST:PORT, index = worker (the
  // trainers' workers by rank, then the dedicated ones); empty: no byte
  // lines.
  std::vector<std::string> worker_metrics;
};

// Runs this rank's trainer. INVALID_ARGUMENT naming the option for a rank
// outside [0, ranks) or fewer than two ranks; the client's, CUDA's or a
// scrape's error (naming the worker) otherwise.
absl::Status RunRanksStep(const RanksStepOptions& options);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_GPU_RANKS_STEP_H_
