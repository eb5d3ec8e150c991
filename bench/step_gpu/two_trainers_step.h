// step_gpu_bench's two-trainer run on one GPU: two trainers (clients of
// this process, each with its own copy of the parameters and its own
// stream, as two processes would have) and two workers sharing the GPU over
// CUDA IPC peer copies. Prints muonps_step_1gpu_2workers. For one thread.
#ifndef MUONPS_BENCH_STEP_GPU_TWO_TRAINERS_STEP_H_
#define MUONPS_BENCH_STEP_GPU_TWO_TRAINERS_STEP_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/step_gpu/llama_matrices.h"

namespace muonps {
namespace bench {

struct TwoTrainersOptions {
  std::string coordinator;           // HOST:PORT
  std::string job;                   // the job both trainers join
  std::vector<std::string> sockets;  // the two workers' Unix sockets
  MatrixSet matrices;
  int warmup = 3;
  int repeats = 10;
  std::string torch_results;       // torch_peers.py's lines (may be empty)
  std::string one_worker_results;  // the one-worker run's lines (may be empty)
};

// Runs it on GPU 0. The client's, CUDA's or a results file's error.
absl::Status RunTwoTrainersStep(const TwoTrainersOptions& options);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_GPU_TWO_TRAINERS_STEP_H_
