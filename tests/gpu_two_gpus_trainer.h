// The trainer processes of gpu_two_gpus_test, and what the test reads back
// from them. A trainer is the test binary run again as
// `/proc/self/exe --gpu2_trainer KEY=VALUE...` (main() hands it to
// RunTrainer before GoogleTest starts): trainer rank r of 2 on GpuOf(r)
// (muonps::Client), lending its buffers to the worker on its GPU, writing
// deterministic gradients each step (the scheme of gpu_two_workers_test),
// retrying a failed step until it is answered or retry_for passes, and at
// the end writing its parameters to a file. It tells the test what it does
// in lines on stdout (its log), one per event, parsed by ParseAttempts and
// ParseNsAlgorithms. Test-only; thread-compatible.
#ifndef MUONPS_TESTS_GPU_TWO_GPUS_TRAINER_H_
#define MUONPS_TESTS_GPU_TWO_GPUS_TRAINER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "newton_schulz/options.h"
#include "scheduler/plan_types.h"
#include "tests/gpu_test_support.h"

namespace muonps {
namespace testing {

// argv[1] of a trainer process.
inline constexpr char kTrainerFlag[] = "--gpu2_trainer";
// Trainers of a job unless its config says otherwise.
inline constexpr int kTrainers = 2;

struct TrainerConfig {
  std::string coordinator;  // host:port
  std::string job;
  std::string socket;  // its worker's Unix socket
  int rank = 0;        // trainer rank of `trainers`; its GPU is GpuOf(rank)
  int trainers = kTrainers;
  // Workers with no trainer the job expects (muonps-worker --dedicated).
  int dedicated = 0;
  std::string layout = "replicated";  // or unreduced, row_sharded
  DType dtype = DType::kFloat32;      // of the lent buffers
  int64_t first_step = 0;
  int64_t last_step = 0;   // inclusive
  std::string params_out;  // where the final parameters go
  // How long a step that fails is retried (every 200 ms) before the
  // trainer gives up (exit status 1); zero: not retried.
  absl::Duration retry_for = absl::ZeroDuration();
};

// The GPU of trainer and worker `rank`: cuda:rank, or cuda:0 for all on a
// machine of one GPU (each worker then a NCCL host of its own:
// TwoGpusTest::StartWorker). -1 without a GPU.
int GpuOf(int rank);

// The argv of a trainer process for `config` (after the executable).
std::vector<std::string> TrainerArgs(const TrainerConfig& config);
// The config of argv[2..] (INVALID_ARGUMENT naming a bad KEY=VALUE).
absl::StatusOr<TrainerConfig> ParseTrainerArgs(int argc, char** argv);
// Runs the trainer: 0 once every step was answered and the parameters
// written; 1 with a "FAILED:" line otherwise.
int RunTrainer(const TrainerConfig& config);

// What both sides compute alike.
scheduler::Layout LayoutOf(const std::string& name);
// Rows of `c` that trainer `rank` of `trainers` holds (the torch.chunk rule
// when row sharded, every row otherwise).
std::pair<int64_t, int64_t> TrainerRows(const MatrixCase& c,
                                        scheduler::Layout layout, int rank,
                                        int trainers = kTrainers);
float InitialParam(size_t m, int64_t i);
// The gradient trainer `rank` holds of matrix `m` at whole-matrix index
// `i`: its own for unreduced matrices, the one shared gradient otherwise.
float TrainerGrad(scheduler::Layout layout, int64_t step, size_t m, int rank,
                  int64_t i);
// Elements trainer `rank` of `trainers` lends of matrix `m`.
int64_t LentElements(const MatrixCase& c, scheduler::Layout layout, int rank,
                     int trainers = kTrainers);

// One answer to a Step call, as the trainer logged it.
struct StepAttempt {
  int rank = -1;
  int64_t step = -1;
  int attempt = -1;
  bool ok = false;
  int64_t plan_version = -1;   // ok only
  int64_t momentum_reset = 0;  // ok only
  double seconds = 0;          // the call's duration
  int64_t at_ms = 0;           // Unix ms when it was answered
  std::string code;            // failed only: absl::StatusCodeToString
  std::string message;         // failed only
};
std::vector<StepAttempt> ParseAttempts(const std::string& log);
// The plan's NS algorithm per matrix, as trainer 0 logged it.
absl::StatusOr<std::map<std::string, NsAlgorithm>> ParseNsAlgorithms(
    const std::string& log);
// The parameters a trainer wrote (widened to float), per matrix of
// Matrices(); DATA_LOSS when the file is short or its counts differ from
// LentElements.
absl::StatusOr<std::vector<std::vector<float>>> ReadTrainerParams(
    const std::string& path, scheduler::Layout layout, int rank,
    int trainers = kTrainers);

}  // namespace testing
}  // namespace muonps

#endif  // MUONPS_TESTS_GPU_TWO_GPUS_TRAINER_H_
