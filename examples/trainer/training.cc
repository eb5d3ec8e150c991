#include "examples/trainer/training.h"

#include <cmath>

#include "common/status.h"
#include "kernels/cpu/cpu_kernels.h"

namespace muonps {
namespace example {

absl::StatusOr<double> ComputeGradient(const TrainConfig& config,
                                       TeacherTask* task, Mlp* model, int step,
                                       int rank) {
  const bool sharded_batch = config.layout == scheduler::Layout::kUnreduced;
  MUONPS_ASSIGN_OR_RETURN(
      const TeacherSamples samples,
      sharded_batch ? task->Shard(step, config.batch, rank, config.ranks)
                    : task->Batch(step, config.batch));
  return model->LossAndGrad(samples.inputs.data(), samples.targets.data(),
                            samples.shard.count, samples.shard.count);
}

absl::StatusOr<double> BatchLoss(const TrainConfig& config, TeacherTask* task,
                                 Mlp* model, int step) {
  MUONPS_ASSIGN_OR_RETURN(const TeacherSamples samples,
                          task->Batch(step, config.batch));
  std::vector<float> y(samples.shard.count * model->output_width());
  MUONPS_RETURN_IF_ERROR(
      model->Forward(samples.inputs.data(), samples.shard.count, y.data()));
  double sum = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double d = static_cast<double>(y[i]) - samples.targets[i];
    sum += d * d;
  }
  return sum / static_cast<double>(y.size());
}

absl::StatusOr<std::vector<float>> TrainReference(const TrainConfig& config) {
  MUONPS_ASSIGN_OR_RETURN(TeacherTask task,
                          TeacherTask::Create({.shape = config.shape}));
  MUONPS_ASSIGN_OR_RETURN(Mlp model, Mlp::Create(config.shape));
  model.Init(config.seed, 1.0f);
  const int64_t n = model.block_floats();
  std::vector<float> grad_sum(n), momentum(n, 0.0f), exp_avg(n, 0.0f),
      exp_avg_sq(n, 0.0f);
  kernels::CpuKernels kernels;
  const int contributors =
      config.layout == scheduler::Layout::kUnreduced ? config.ranks : 1;
  for (int step = 0; step < config.steps; ++step) {
    std::fill(grad_sum.begin(), grad_sum.end(), 0.0f);
    for (int r = 0; r < contributors; ++r) {
      MUONPS_RETURN_IF_ERROR(
          ComputeGradient(config, &task, &model, step, r).status());
      for (int64_t i = 0; i < n; ++i) grad_sum[i] += model.grads_data()[i];
    }
    for (float& g : grad_sum) g *= 1.0f / static_cast<float>(contributors);
    for (const MlpParameter& p : model.parameters()) {
      float* param = model.params_data() + p.offset;
      float* grad = grad_sum.data() + p.offset;
      if (p.is_matrix) {
        kernels::MuonHyperparameters muon = config.muon;
        auto chosen = config.algorithms.find(p.name);
        if (chosen != config.algorithms.end()) {
          muon.ns.algorithm = chosen->second;
        }
        kernels::MuonStack stack;
        stack.names = {p.name};
        stack.grad = {grad, 1, p.shape[0], p.shape[1]};
        stack.momentum = {momentum.data() + p.offset, 1, p.shape[0],
                          p.shape[1]};
        stack.param = {param, 1, p.shape[0], p.shape[1]};
        MUONPS_RETURN_IF_ERROR(kernels.MuonStep(stack, muon, kHostStream));
      } else {
        MUONPS_RETURN_IF_ERROR(
            kernels.AdamWStep({p.name, param, grad, exp_avg.data() + p.offset,
                               exp_avg_sq.data() + p.offset, p.num_elements},
                              config.adamw, step + 1, kHostStream));
      }
    }
  }
  return std::vector<float>(model.params_data(), model.params_data() + n);
}

double MaxRelativeError(const Mlp& layout, const float* a, const float* b) {
  double worst = 0;
  for (const MlpParameter& p : layout.parameters()) {
    double diff = 0, ref = 0;
    for (int64_t i = 0; i < p.num_elements; ++i) {
      const double x = a[p.offset + i], y = b[p.offset + i];
      diff += (x - y) * (x - y);
      ref += y * y;
    }
    const double err = ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
    if (std::isnan(err) || err > worst) worst = std::isnan(err) ? NAN : err;
    if (std::isnan(worst)) return worst;
  }
  return worst;
}

}  // namespace example
}  // namespace muonps
