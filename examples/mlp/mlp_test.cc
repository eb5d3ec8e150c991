#include "examples/mlp/mlp.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "examples/mlp/teacher.h"
#include "gtest/gtest.h"
#include "lending/shared_memory.h"

namespace muonps {
namespace {

Mlp MakeMlp(std::vector<int64_t> widths, uint32_t seed, float scale = 1.0f) {
  absl::StatusOr<Mlp> mlp = Mlp::Create(MlpShape{std::move(widths)});
  EXPECT_TRUE(mlp.ok()) << mlp.status();
  mlp->Init(seed, scale);
  return *std::move(mlp);
}

// The same network in double precision, parameters taken from an Mlp, so
// the fp32 implementation is checked against math that does not share its
// code (nor its GEMMs).
class DoubleReference {
 public:
  explicit DoubleReference(const Mlp& mlp) : widths_(mlp.shape().widths) {
    for (const MlpParameter& parameter : mlp.parameters()) {
      const float* values = mlp.params_data() + parameter.offset;
      tensors_.emplace_back(values, values + parameter.num_elements);
    }
  }

  // Parameter `index` of mlp.parameters(), element by element.
  std::vector<double>& tensor(size_t index) { return tensors_[index]; }

  std::vector<double> Forward(const std::vector<float>& x,
                              int64_t batch) const {
    std::vector<double> in(x.begin(), x.end());
    const size_t layers = widths_.size() - 1;
    for (size_t l = 0; l < layers; ++l) {
      const int64_t n_in = widths_[l], n_out = widths_[l + 1];
      const std::vector<double>& w = tensors_[2 * l];
      const std::vector<double>& b = tensors_[2 * l + 1];
      std::vector<double> out(batch * n_out);
      for (int64_t i = 0; i < batch; ++i) {
        for (int64_t o = 0; o < n_out; ++o) {
          double sum = b[o];
          for (int64_t k = 0; k < n_in; ++k) {
            sum += w[o * n_in + k] * in[i * n_in + k];
          }
          out[i * n_out + o] = (l + 1 < layers) ? std::max(sum, 0.0) : sum;
        }
      }
      in = std::move(out);
    }
    return in;
  }

  double Loss(const std::vector<float>& x, const std::vector<float>& target,
              int64_t batch, int64_t loss_batch_scale) const {
    const std::vector<double> y = Forward(x, batch);
    double sum = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
      sum += (y[i] - target[i]) * (y[i] - target[i]);
    }
    return sum / (static_cast<double>(loss_batch_scale) * widths_.back());
  }

 private:
  std::vector<int64_t> widths_;
  std::vector<std::vector<double>> tensors_;
};

std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = std::sin(0.37f * i + 1.3f * seed) + 0.1f * std::cos(2.1f * i);
  }
  return v;
}

double Norm(const std::vector<double>& v) {
  double sum = 0.0;
  for (double x : v) sum += x * x;
  return std::sqrt(sum);
}

// ||a - b|| / ||b|| over one tensor.
double RelativeError(const float* a, const std::vector<double>& b) {
  std::vector<double> diff(b.size());
  for (size_t i = 0; i < b.size(); ++i) diff[i] = a[i] - b[i];
  return Norm(diff) / Norm(b);
}

// Every gradient element against central differences of the double
// reference loss (step 1e-5: truncation ~1e-10, rounding ~1e-11 relative).
void CheckGradientsAgainstFiniteDifferences(std::vector<int64_t> widths,
                                            int64_t batch,
                                            int64_t loss_batch_scale) {
  SCOPED_TRACE(absl::StrCat("widths[0]=", widths[0],
                            " layers=", widths.size() - 1, " batch=", batch,
                            " loss_batch_scale=", loss_batch_scale));
  Mlp mlp = MakeMlp(widths, /*seed=*/11, /*scale=*/1.5f);
  const std::vector<float> x = RandomVector(batch * mlp.input_width(), 1);
  const std::vector<float> target = RandomVector(batch * mlp.output_width(), 2);
  absl::StatusOr<double> loss =
      mlp.LossAndGrad(x.data(), target.data(), batch, loss_batch_scale);
  ASSERT_TRUE(loss.ok()) << loss.status();

  DoubleReference reference(mlp);
  EXPECT_NEAR(*loss, reference.Loss(x, target, batch, loss_batch_scale),
              1e-5 * *loss);
  constexpr double kStep = 1e-5;
  for (size_t t = 0; t < mlp.parameters().size(); ++t) {
    const MlpParameter& parameter = mlp.parameters()[t];
    std::vector<double> numeric(parameter.num_elements);
    for (int64_t i = 0; i < parameter.num_elements; ++i) {
      double& value = reference.tensor(t)[i];
      const double saved = value;
      value = saved + kStep;
      const double plus = reference.Loss(x, target, batch, loss_batch_scale);
      value = saved - kStep;
      const double minus = reference.Loss(x, target, batch, loss_batch_scale);
      value = saved;
      numeric[i] = (plus - minus) / (2 * kStep);
    }
    const float* analytic = mlp.grads_data() + parameter.offset;
    ASSERT_GT(Norm(numeric), 0.0) << parameter.name << " has no gradient";
    EXPECT_LT(RelativeError(analytic, numeric), 1e-3) << parameter.name;
    double max_ref = 0.0;
    for (double g : numeric) max_ref = std::max(max_ref, std::abs(g));
    for (int64_t i = 0; i < parameter.num_elements; ++i) {
      ASSERT_NEAR(analytic[i], numeric[i], 1e-3 * max_ref)
          << parameter.name << "[" << i << "]";
    }
  }
}

TEST(MlpGradientTest, EveryParameterMatchesFiniteDifferencesOfDoubleLoss) {
  CheckGradientsAgainstFiniteDifferences({5, 7, 6, 3}, 6, 6);
  CheckGradientsAgainstFiniteDifferences({4, 3}, 5, 5);
  CheckGradientsAgainstFiniteDifferences({3, 9, 8, 7, 2}, 4, 4);
}

TEST(MlpGradientTest, LossBatchScaleDividesLossAndGradients) {
  CheckGradientsAgainstFiniteDifferences({5, 7, 3}, 6, 24);
}

TEST(MlpForwardTest, MatchesDoubleReferenceAndLossAndGradsForward) {
  Mlp mlp = MakeMlp({6, 10, 4}, 3);
  const int64_t batch = 9;
  const std::vector<float> x = RandomVector(batch * 6, 5);
  std::vector<float> y(batch * 4);
  ASSERT_TRUE(mlp.Forward(x.data(), batch, y.data()).ok());
  const std::vector<double> expected = DoubleReference(mlp).Forward(x, batch);
  EXPECT_LT(RelativeError(y.data(), expected), 1e-6);
}

// Mean (or sum) over ranks' shard gradients, in double, per tensor.
std::vector<double> CombineShards(TeacherTask& task, Mlp& mlp, int world_size,
                                  int64_t batch_size, bool ddp_mean,
                                  double* combined_loss) {
  std::vector<double> combined(mlp.block_floats(), 0.0);
  *combined_loss = 0.0;
  for (int rank = 0; rank < world_size; ++rank) {
    absl::StatusOr<TeacherSamples> shard =
        task.Shard(/*batch_index=*/4, batch_size, rank, world_size);
    EXPECT_TRUE(shard.ok()) << shard.status();
    const int64_t scale = ddp_mean ? shard->shard.count : batch_size;
    absl::StatusOr<double> loss = mlp.LossAndGrad(
        shard->inputs.data(), shard->targets.data(), shard->shard.count, scale);
    EXPECT_TRUE(loss.ok()) << loss.status();
    const double weight = ddp_mean ? 1.0 / world_size : 1.0;
    *combined_loss += weight * *loss;
    for (int64_t i = 0; i < mlp.block_floats(); ++i) {
      combined[i] += weight * mlp.grads_data()[i];
    }
  }
  return combined;
}

void ExpectShardsCombineToFullBatch(int world_size, int64_t batch_size,
                                    bool ddp_mean) {
  SCOPED_TRACE(absl::StrCat("world_size=", world_size, " batch=", batch_size,
                            ddp_mean ? " mean of shard means" : " sum"));
  TeacherTaskConfig config;
  config.shape.widths = {16, 32, 32, 4};
  absl::StatusOr<TeacherTask> task = TeacherTask::Create(config);
  ASSERT_TRUE(task.ok()) << task.status();
  Mlp student = MakeMlp(config.shape.widths, 9);

  double combined_loss = 0.0;
  const std::vector<double> combined = CombineShards(
      *task, student, world_size, batch_size, ddp_mean, &combined_loss);

  absl::StatusOr<TeacherSamples> full = task->Batch(4, batch_size);
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<double> full_loss = student.LossAndGrad(
      full->inputs.data(), full->targets.data(), batch_size, batch_size);
  ASSERT_TRUE(full_loss.ok()) << full_loss.status();
  EXPECT_NEAR(combined_loss, *full_loss, 1e-6 * *full_loss);
  for (const MlpParameter& parameter : student.parameters()) {
    const std::vector<double> part(
        combined.begin() + parameter.offset,
        combined.begin() + parameter.offset + parameter.num_elements);
    std::vector<double> full_grad(
        student.grads_data() + parameter.offset,
        student.grads_data() + parameter.offset + parameter.num_elements);
    std::vector<double> diff(part.size());
    for (size_t i = 0; i < part.size(); ++i) diff[i] = part[i] - full_grad[i];
    EXPECT_LT(Norm(diff), 1e-6 * Norm(full_grad)) << parameter.name;
  }
}

TEST(MlpShardTest, MeanOfEqualShardMeanGradientsIsFullBatchGradient) {
  ExpectShardsCombineToFullBatch(4, 64, /*ddp_mean=*/true);
  ExpectShardsCombineToFullBatch(3, 48, /*ddp_mean=*/true);
  ExpectShardsCombineToFullBatch(1, 16, /*ddp_mean=*/true);
}

TEST(MlpShardTest, SumOfGlobalScaleGradientsIsFullBatchGradientForAnySplit) {
  ExpectShardsCombineToFullBatch(4, 66, /*ddp_mean=*/false);
  ExpectShardsCombineToFullBatch(5, 64, /*ddp_mean=*/false);
}

TEST(MlpTrainingTest, PlainSgdOnTeacherTaskCutsHeldOutLossTenfold) {
  TeacherTaskConfig config;
  config.shape.widths = {16, 64, 64, 4};
  absl::StatusOr<TeacherTask> task = TeacherTask::Create(config);
  ASSERT_TRUE(task.ok()) << task.status();
  Mlp student = MakeMlp(config.shape.widths, 7);
  // A batch index no training step uses.
  absl::StatusOr<TeacherSamples> held_out = task->Batch(1000000, 1024);
  ASSERT_TRUE(held_out.ok()) << held_out.status();
  auto held_out_loss = [&]() {
    absl::StatusOr<double> loss = student.LossAndGrad(
        held_out->inputs.data(), held_out->targets.data(), 1024, 1024);
    EXPECT_TRUE(loss.ok()) << loss.status();
    return *loss;
  };
  const double before = held_out_loss();

  constexpr float kLearningRate = 0.2f;
  for (int step = 0; step < 500; ++step) {
    absl::StatusOr<TeacherSamples> batch = task->Batch(step, 64);
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_TRUE(
        student.LossAndGrad(batch->inputs.data(), batch->targets.data(), 64, 64)
            .ok());
    for (int64_t i = 0; i < student.block_floats(); ++i) {
      student.params_data()[i] -= kLearningRate * student.grads_data()[i];
    }
  }
  const double after = held_out_loss();
  EXPECT_GT(before, 10 * after) << "before " << before << " after " << after;
}

TEST(MlpDeterminismTest, SameSeedGivesBitwiseSameParametersAndGradients) {
  Mlp a = MakeMlp({8, 16, 3}, 21);
  Mlp b = MakeMlp({8, 16, 3}, 21);
  Mlp other = MakeMlp({8, 16, 3}, 22);
  const size_t bytes = a.block_floats() * sizeof(float);
  EXPECT_EQ(std::memcmp(a.params_data(), b.params_data(), bytes), 0);
  EXPECT_NE(std::memcmp(a.params_data(), other.params_data(), bytes), 0);

  const std::vector<float> x = RandomVector(10 * 8, 3);
  const std::vector<float> target = RandomVector(10 * 3, 4);
  absl::StatusOr<double> loss_a =
      a.LossAndGrad(x.data(), target.data(), 10, 10);
  absl::StatusOr<double> loss_b =
      b.LossAndGrad(x.data(), target.data(), 10, 10);
  ASSERT_TRUE(loss_a.ok() && loss_b.ok());
  EXPECT_EQ(*loss_a, *loss_b);
  EXPECT_EQ(std::memcmp(a.grads_data(), b.grads_data(), bytes), 0);
  // Again on the same object: scratch reuse changes nothing.
  std::vector<float> first_grads(a.grads_data(),
                                 a.grads_data() + a.block_floats());
  ASSERT_TRUE(a.LossAndGrad(x.data(), target.data(), 10, 10).ok());
  EXPECT_EQ(std::memcmp(a.grads_data(), first_grads.data(), bytes), 0);
}

TEST(MlpLayoutTest, TensorsAreNamedShapedAlignedAndDisjoint) {
  Mlp mlp = MakeMlp({64, 256, 256, 32}, 1);
  const std::vector<MlpParameter>& parameters = mlp.parameters();
  ASSERT_EQ(parameters.size(), 6u);
  const std::vector<std::vector<int64_t>> shapes = {
      {256, 64}, {256}, {256, 256}, {256}, {32, 256}, {32}};
  int64_t end = 0, total = 0;
  for (size_t t = 0; t < parameters.size(); ++t) {
    const MlpParameter& p = parameters[t];
    EXPECT_EQ(p.name,
              absl::StrCat("layers.", t / 2, t % 2 == 0 ? ".weight" : ".bias"));
    EXPECT_EQ(p.shape, shapes[t]);
    EXPECT_EQ(p.is_matrix, t % 2 == 0);
    EXPECT_EQ(p.offset % Mlp::kAlignmentFloats, 0);
    EXPECT_GE(p.offset, end);
    end = p.offset + p.num_elements;
    total += p.num_elements;
  }
  EXPECT_EQ(mlp.num_parameters(), total);
  EXPECT_GE(mlp.block_floats(), end);
  EXPECT_EQ(mlp.block_floats() % Mlp::kAlignmentFloats, 0);

  absl::StatusOr<TensorView> weight = mlp.ParameterView("layers.1.weight");
  ASSERT_TRUE(weight.ok()) << weight.status();
  EXPECT_EQ(weight->DebugString(), "fp32[256, 256]");
  EXPECT_EQ(weight->float_data(), mlp.params_data() + parameters[2].offset);
  absl::StatusOr<TensorView> bias_grad = mlp.GradientView("layers.2.bias");
  ASSERT_TRUE(bias_grad.ok()) << bias_grad.status();
  EXPECT_EQ(bias_grad->float_data(), mlp.grads_data() + parameters[5].offset);
  EXPECT_EQ(mlp.ParameterView("layers.3.weight").status().code(),
            absl::StatusCode::kNotFound);
}

// The trainer's use: parameters and gradients in shared memory, where the
// worker (here a second mapping) reads gradients and writes parameters.
TEST(MlpStorageTest, BoundSharedMemoryHoldsParametersAndGradients) {
  Mlp owned = MakeMlp({8, 12, 4}, 5);
  absl::StatusOr<Mlp> bound = Mlp::Create(owned.shape());
  ASSERT_TRUE(bound.ok()) << bound.status();
  const size_t block_bytes = bound->block_floats() * sizeof(float);
  // The pid alone is not unique: Bazel's sandbox runs each test in its own
  // PID namespace over a shared /dev/shm.
  const std::string name = absl::StrCat("/muonps-mlp-test-", getpid(), "-",
                                        absl::Hex(std::random_device()()));
  absl::StatusOr<SharedMemorySegment> trainer =
      SharedMemorySegment::Create(name, 2 * block_bytes);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::StatusOr<SharedMemorySegment> worker =
      SharedMemorySegment::Open(name, 2 * block_bytes);
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto* trainer_floats = static_cast<float*>(trainer->data());
  ASSERT_TRUE(
      bound->BindStorage(trainer_floats, trainer_floats + bound->block_floats())
          .ok());
  bound->Init(5, 1.0f);
  const auto* worker_params = static_cast<const float*>(worker->data());
  EXPECT_EQ(std::memcmp(worker_params, owned.params_data(), block_bytes), 0)
      << "Init must not depend on where the storage is";

  const std::vector<float> x = RandomVector(3 * 8, 1);
  const std::vector<float> target = RandomVector(3 * 4, 2);
  ASSERT_TRUE(bound->LossAndGrad(x.data(), target.data(), 3, 3).ok());
  ASSERT_TRUE(owned.LossAndGrad(x.data(), target.data(), 3, 3).ok());
  EXPECT_EQ(std::memcmp(worker_params + bound->block_floats(),
                        owned.grads_data(), block_bytes),
            0);

  // An update the worker writes changes the trainer's next forward.
  std::vector<float> y_before(3 * 4), y_after(3 * 4);
  ASSERT_TRUE(bound->Forward(x.data(), 3, y_before.data()).ok());
  const int64_t bias = bound->parameters()[3].offset;  // layers.1.bias
  static_cast<float*>(worker->data())[bias] += 1.0f;
  ASSERT_TRUE(bound->Forward(x.data(), 3, y_after.data()).ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(y_after[i * 4], y_before[i * 4] + 1.0f, 1e-5);
    EXPECT_EQ(y_after[i * 4 + 1], y_before[i * 4 + 1]);
  }
}

TEST(MlpValidationTest, BadShapesBatchesAndStorageAreInvalidArgumentNamed) {
  EXPECT_NE(Mlp::Create(MlpShape{{5}}).status().message().find("widths"),
            absl::string_view::npos);
  absl::Status zero = Mlp::Create(MlpShape{{5, 0, 3}}).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(zero.message().find("widths[1]"), absl::string_view::npos) << zero;

  Mlp mlp = MakeMlp({2, 3}, 1);
  float x[4] = {}, y[6] = {};
  EXPECT_EQ(mlp.Forward(x, 0, y).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mlp.Forward(nullptr, 1, y).message().find("x"),
            absl::string_view::npos);
  absl::Status scale = mlp.LossAndGrad(x, y, 2, 0).status();
  EXPECT_NE(scale.message().find("loss_batch_scale"), absl::string_view::npos)
      << scale;

  std::vector<float> block(2 * mlp.block_floats());
  absl::Status overlap =
      mlp.BindStorage(block.data(), block.data() + mlp.block_floats() - 1);
  EXPECT_NE(overlap.message().find("overlaps"), absl::string_view::npos)
      << overlap;
  EXPECT_NE(mlp.BindStorage(nullptr, block.data()).message().find("params"),
            absl::string_view::npos);
  // A rejected bind leaves the owned storage in use.
  EXPECT_TRUE(mlp.Forward(x, 2, y).ok());
}

}  // namespace
}  // namespace muonps
