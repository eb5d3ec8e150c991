// The example's training step logic, shared by the distributed trainer
// (through muonps::Client) and the single-process reference run that checks
// it: which gradient each rank computes for each layout, and the reference
// optimizer step with the same kernels. Thread-compatible.
#ifndef MUONPS_EXAMPLES_TRAINER_TRAINING_H_
#define MUONPS_EXAMPLES_TRAINER_TRAINING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "examples/mlp/mlp.h"
#include "examples/mlp/teacher.h"
#include "kernels/muon_kernels.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace example {

struct TrainConfig {
  MlpShape shape;  // the student (and teacher) widths
  int64_t batch = 256;
  int steps = 30;
  scheduler::Layout layout = scheduler::Layout::kUnreduced;
  int ranks = 1;
  uint32_t seed = 7;
  kernels::MuonHyperparameters muon;
  kernels::AdamWHyperparameters adamw;
  // The Newton-Schulz algorithm of each matrix, by name, as the service's
  // plan runs it (Client::NsAlgorithms); matrices not named use
  // muon.ns.algorithm. NS5 and Gram NS agree only to rounding, and the
  // training loop amplifies rounding (see TrainReference), so a reference
  // that must match the service bit for bit runs the same algorithms.
  std::map<std::string, NsAlgorithm> algorithms;
};

// The gradient rank `rank` holds for step `step` in the model's gradient
// block: unreduced → the mean-loss gradient of its shard of the batch (the
// workers average them, as DDP); replicated and row_sharded → the whole
// batch's gradient (already reduced; row_sharded ranks then lend only their
// rows). Returns the loss that gradient belongs to.
absl::StatusOr<double> ComputeGradient(const TrainConfig& config,
                                       TeacherTask* task, Mlp* model, int step,
                                       int rank);

// Mean squared error of `model` on the whole batch of `step`.
absl::StatusOr<double> BatchLoss(const TrainConfig& config, TeacherTask* task,
                                 Mlp* model, int step);

// Trains `config.steps` steps in one process with the CPU kernels, the
// gradients of all ranks averaged as the workers do (an fp32 sum in rank
// order, times the fp32 inverse), and returns the final parameter block.
//
// The closed loop is ill-conditioned: a difference of one rounding in one
// step (e.g. NS5 against Gram NS, 1e-6 relative) moves a ReLU unit across
// its kink a few steps later and the trajectories part by 1e-3..1e-2 within
// 50 steps (training_test.cc measures it). So a distributed run matches
// this only when it computes the same bits: same algorithms per matrix
// (config.algorithms), same reduction order.
absl::StatusOr<std::vector<float>> TrainReference(const TrainConfig& config);

// Largest ||a - b||_F / ||b||_F over the model's tensors.
double MaxRelativeError(const Mlp& layout, const float* a, const float* b);

}  // namespace example
}  // namespace muonps

#endif  // MUONPS_EXAMPLES_TRAINER_TRAINING_H_
