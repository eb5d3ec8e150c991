// One trainer rank of bench/step_cpu, run as a thread of the bench process:
// declares the model's matrices through muonps::Client (layout unreduced,
// the DDP replacement), starts, writes its gradients once, then steps in
// lockstep with the other ranks and records what each step took.
//
// Steps: `warmup_steps` untimed, then `timed_steps` through Client::Step,
// then `probe_steps` through the worker's Step RPC directly. The probes
// exist because Client::StepResult carries no Newton-Schulz time while the
// RPC's StepResponse does; with no AdamW tensors in the model, the RPC is
// all that Client::Step does.
//
// Every step is bracketed by two waits on a barrier shared with the other
// ranks and the one-process peer: all ranks step between the first and the
// second, and the peer steps after the second (while the ranks wait for the
// next step's first), so muonps and the peer alternate and share whatever
// else loads the machine. Thread-safe: one call per rank, concurrently.
#ifndef MUONPS_BENCH_STEP_CPU_TRAINER_RANK_H_
#define MUONPS_BENCH_STEP_CPU_TRAINER_RANK_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bench/step_cpu/step_model.h"

namespace muonps {
namespace bench {

// A reusable barrier for a fixed number of threads. Abort() releases every
// waiter now and later with false (a rank failed). Thread-safe.
class LockstepBarrier {
 public:
  explicit LockstepBarrier(int parties) : parties_(parties) {}
  LockstepBarrier(const LockstepBarrier&) = delete;
  LockstepBarrier& operator=(const LockstepBarrier&) = delete;

  // Blocks until `parties` threads have called Wait (true) or Abort was
  // called (false).
  bool Wait();
  void Abort();

 private:
  const int parties_;
  absl::Mutex mu_;
  absl::CondVar changed_;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

struct TrainerRankOptions {
  std::string coordinator;
  std::string job;
  std::string worker_socket;
  int rank = 0;
  int ranks = 2;
  // Workers the plan must include before stepping starts.
  int workers = 2;
  std::vector<StepMatrix> matrices;
  int warmup_steps = 2;
  int timed_steps = 5;
  int probe_steps = 3;
};

using SteadyTime = std::chrono::steady_clock::time_point;

struct RankStep {
  SteadyTime start;
  SteadyTime end;
  int64_t bytes_moved = 0;
  int64_t plan_version = 0;
  int64_t momentum_reset = 0;
  // Probe steps only: the worker's own step and Newton-Schulz seconds.
  double worker_seconds = 0;
  double ns_seconds = 0;
};

struct TrainerRankResult {
  std::vector<RankStep> timed;   // Client::Step
  std::vector<RankStep> probes;  // the Step RPC
  // The parameters after every step, matrix after matrix.
  std::vector<float> final_params;
};

// Runs the rank; every rank and the peer must use the same barrier (of
// ranks + 1 parties). On error the barrier is aborted so the others stop
// too.
absl::StatusOr<TrainerRankResult> RunTrainerRank(
    const TrainerRankOptions& options, LockstepBarrier* barrier);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_CPU_TRAINER_RANK_H_
