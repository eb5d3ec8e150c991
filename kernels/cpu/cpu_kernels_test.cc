// Checks the CPU backend's momentum, apply, whole Muon step and AdamW
// against their fp64 twins, batching, and the rejection of bad input.
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/reference/reference_muon.h"
#include "kernels/reference/test_matrices.h"

namespace muonps {
namespace kernels {
namespace {

using reference::GaussianMatrix;
using reference::RelativeError;
using ::testing::HasSubstr;

MatrixStack Stack(std::vector<float>& v, int64_t count, int64_t rows,
                  int64_t cols) {
  return MatrixStack{v.data(), count, rows, cols};
}

TEST(UpdateMomentumTest, MatchesFp64TwinOverTenStepsWithAndWithoutNesterov) {
  for (const bool nesterov : {true, false}) {
    CpuKernels kernels;
    std::vector<float> momentum(40 * 30, 0.0f), update(40 * 30);
    reference::Matrix want_momentum(40 * 30, 0.0);
    for (uint32_t step = 0; step < 10; ++step) {
      std::vector<float> grad = GaussianMatrix(40, 30, step);
      ASSERT_TRUE(kernels
                      .UpdateMomentum(
                          Stack(grad, 1, 40, 30), Stack(momentum, 1, 40, 30),
                          Stack(momentum, 1, 40, 30), 0.95, nesterov,
                          Stack(update, 1, 40, 30), kHostStream)
                      .ok());
      reference::Matrix want_update(grad.size());
      for (size_t i = 0; i < grad.size(); ++i) {
        want_momentum[i] += 0.05 * (grad[i] - want_momentum[i]);
        want_update[i] = nesterov
                             ? grad[i] + 0.95 * (want_momentum[i] - grad[i])
                             : want_momentum[i];
      }
      EXPECT_LT(RelativeError(momentum, want_momentum), 1e-6);
      EXPECT_LT(RelativeError(update, want_update), 1e-6);
    }
  }
}

TEST(UpdateMomentumTest, BesideThePreviousLeavesItAndMatchesInPlace) {
  CpuKernels kernels;
  std::vector<float> grad = GaussianMatrix(40, 30, 1);
  const std::vector<float> start = GaussianMatrix(40, 30, 2);
  std::vector<float> previous = start, beside(start.size()), in_place = start;
  std::vector<float> update(start.size()), want_update(start.size());
  ASSERT_TRUE(kernels
                  .UpdateMomentum(Stack(grad, 1, 40, 30),
                                  Stack(previous, 1, 40, 30),
                                  Stack(beside, 1, 40, 30), 0.9, true,
                                  Stack(update, 1, 40, 30), kHostStream)
                  .ok());
  ASSERT_TRUE(kernels
                  .UpdateMomentum(Stack(grad, 1, 40, 30),
                                  Stack(in_place, 1, 40, 30),
                                  Stack(in_place, 1, 40, 30), 0.9, true,
                                  Stack(want_update, 1, 40, 30), kHostStream)
                  .ok());
  EXPECT_EQ(previous, start);
  EXPECT_EQ(beside, in_place);
  EXPECT_EQ(update, want_update);
  // The update may not overwrite the previous momentum it reads.
  const absl::Status aliased =
      kernels.UpdateMomentum(Stack(grad, 1, 40, 30), Stack(previous, 1, 40, 30),
                             Stack(beside, 1, 40, 30), 0.9, true,
                             Stack(previous, 1, 40, 30), kHostStream);
  EXPECT_EQ(aliased.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(aliased.message(), HasSubstr("update"));
  EXPECT_THAT(aliased.message(), HasSubstr("previous"));
}

// Runs `steps` Muon steps on a stack of `count` rows x cols matrices and
// returns the worst relative error of params and momentum against the fp64
// twin run matrix by matrix.
struct TwinErrors {
  double param = 0;
  double momentum = 0;
};

TwinErrors MuonStepsAgainstTwin(int64_t count, int64_t rows, int64_t cols,
                                const MuonHyperparameters& hyper, int steps) {
  CpuKernels kernels(CpuKernelOptions{.threads = 1});
  const int64_t size = rows * cols;
  std::vector<float> param = GaussianMatrix(count * rows, cols, 99, 0.1f);
  std::vector<float> momentum(count * size, 0.0f);
  std::vector<reference::Matrix> want_param(count), want_momentum(count);
  for (int64_t b = 0; b < count; ++b) {
    want_param[b].assign(param.begin() + b * size,
                         param.begin() + (b + 1) * size);
    want_momentum[b].assign(size, 0.0);
  }
  TwinErrors errors;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> grad = GaussianMatrix(count * rows, cols, 1000 + step);
    MuonStack stack;
    for (int64_t b = 0; b < count; ++b) stack.names.push_back("m");
    stack.grad = Stack(grad, count, rows, cols);
    stack.momentum = Stack(momentum, count, rows, cols);
    stack.param = Stack(param, count, rows, cols);
    EXPECT_TRUE(kernels.MuonStep(stack, hyper, kHostStream).ok());
    for (int64_t b = 0; b < count; ++b) {
      const reference::Matrix g(grad.begin() + b * size,
                                grad.begin() + (b + 1) * size);
      reference::MuonStep(g, rows, cols, hyper, &want_momentum[b],
                          &want_param[b]);
      const std::vector<float> p(param.begin() + b * size,
                                 param.begin() + (b + 1) * size);
      const std::vector<float> m(momentum.begin() + b * size,
                                 momentum.begin() + (b + 1) * size);
      errors.param = std::max(errors.param, RelativeError(p, want_param[b]));
      errors.momentum =
          std::max(errors.momentum, RelativeError(m, want_momentum[b]));
    }
  }
  return errors;
}

TEST(MuonStepTest, MatchesFp64TwinForFiveStepsInBatchesOf1And64) {
  for (const NsAlgorithm algorithm : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    for (const int64_t count : {1, 64}) {
      MuonHyperparameters hyper;
      hyper.lr = 0.02;
      hyper.weight_decay = 0.1;
      hyper.ns.algorithm = algorithm;
      hyper.lr_adjustment = LrAdjustment::kMatchRmsAdamW;
      const TwinErrors e = MuonStepsAgainstTwin(count, 24, 40, hyper, 5);
      EXPECT_LT(e.param, 1e-5) << NsAlgorithmName(algorithm) << " " << count;
      EXPECT_LT(e.momentum, 1e-6) << NsAlgorithmName(algorithm) << " " << count;
    }
  }
  MuonHyperparameters plain;
  plain.nesterov = false;
  plain.lr = 0.05;
  const TwinErrors tall = MuonStepsAgainstTwin(3, 50, 20, plain, 5);
  EXPECT_LT(tall.param, 1e-5);
  EXPECT_LT(tall.momentum, 1e-6);
}

TEST(MuonStepTest, BatchOf64EqualsSixtyFourSingleCallsBitForBit) {
  const int64_t count = 64, rows = 16, cols = 48, size = rows * cols;
  MuonHyperparameters hyper;
  hyper.ns.algorithm = NsAlgorithm::kGram;
  std::vector<float> grad = GaussianMatrix(count * rows, cols, 5);
  std::vector<float> param = GaussianMatrix(count * rows, cols, 6);
  std::vector<float> momentum(count * size, 0.0f);
  std::vector<float> single_param = param, single_momentum = momentum;
  CpuKernels kernels(CpuKernelOptions{.threads = 1});
  MuonStack batch{{"experts"},
                  Stack(grad, count, rows, cols),
                  Stack(momentum, count, rows, cols),
                  Stack(param, count, rows, cols)};
  ASSERT_TRUE(kernels.MuonStep(batch, hyper, kHostStream).ok());
  for (int64_t b = 0; b < count; ++b) {
    MuonStack one{{"one"},
                  {grad.data() + b * size, 1, rows, cols},
                  {single_momentum.data() + b * size, 1, rows, cols},
                  {single_param.data() + b * size, 1, rows, cols}};
    ASSERT_TRUE(kernels.MuonStep(one, hyper, kHostStream).ok());
  }
  EXPECT_EQ(param, single_param);
  EXPECT_EQ(momentum, single_momentum);
}

// With a 16-bit update_dtype the step applies Orthogonalize's result
// rounded to it (what a worker sends), and only that differs from fp32.
TEST(MuonStepTest, A16BitUpdateDtypeRoundsTheResultBeforeTheApply) {
  const int64_t rows = 24, cols = 40, size = rows * cols;
  MuonHyperparameters hyper;
  std::vector<float> grad = GaussianMatrix(rows, cols, 7);
  const std::vector<float> start = GaussianMatrix(rows, cols, 8);
  for (const DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    CpuKernels kernels(CpuKernelOptions{.threads = 1, .update_dtype = dtype});
    EXPECT_EQ(kernels.update_dtype(), dtype);
    std::vector<float> param = start, momentum(size, 0.0f);
    ASSERT_TRUE(kernels
                    .MuonStep({{"w"},
                               Stack(grad, 1, rows, cols),
                               Stack(momentum, 1, rows, cols),
                               Stack(param, 1, rows, cols)},
                              hyper, kHostStream)
                    .ok());
    std::vector<float> want = start, want_momentum(size, 0.0f), update(size);
    ASSERT_TRUE(kernels
                    .UpdateMomentum(Stack(grad, 1, rows, cols),
                                    Stack(want_momentum, 1, rows, cols),
                                    Stack(want_momentum, 1, rows, cols),
                                    hyper.momentum, hyper.nesterov,
                                    Stack(update, 1, rows, cols), kHostStream)
                    .ok());
    ASSERT_TRUE(kernels
                    .Orthogonalize(Stack(update, 1, rows, cols),
                                   Stack(update, 1, rows, cols), hyper.ns,
                                   kHostStream)
                    .ok());
    std::vector<uint16_t> narrow(size);
    FromFloat(dtype, update.data(), size, narrow.data());
    std::vector<float> rounded(size);
    ToFloat(dtype, narrow.data(), size, rounded.data());
    EXPECT_NE(rounded, update) << DTypeName(dtype);
    ASSERT_TRUE(kernels
                    .ApplyUpdate(Stack(want, 1, rows, cols),
                                 Stack(rounded, 1, rows, cols), hyper.lr,
                                 hyper.weight_decay, hyper.lr_adjustment,
                                 kHostStream)
                    .ok());
    EXPECT_EQ(param, want) << DTypeName(dtype);
    EXPECT_EQ(momentum, want_momentum) << DTypeName(dtype);
  }
}

TEST(MuonStepTest, NonFiniteGradientIsRejectedByNameAndNothingIsWritten) {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(),
                              std::numeric_limits<float>::infinity()};
  for (const float bad : bad_values) {
    std::vector<float> grad = GaussianMatrix(4 * 8, 8, 1);
    grad[2 * 64 + 3 * 8 + 5] = bad;  // matrix 2, element [3, 5]
    std::vector<float> param = GaussianMatrix(4 * 8, 8, 2);
    std::vector<float> momentum = GaussianMatrix(4 * 8, 8, 3);
    const std::vector<float> param_before = param, momentum_before = momentum;
    MuonStack stack{{"l.0", "l.1", "l.2", "l.3"},
                    Stack(grad, 4, 8, 8),
                    Stack(momentum, 4, 8, 8),
                    Stack(param, 4, 8, 8)};
    CpuKernels kernels;
    const absl::Status status = kernels.MuonStep(stack, {}, kHostStream);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("\"l.2\""));
    EXPECT_THAT(std::string(status.message()), HasSubstr("[3, 5]"));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(std::isnan(bad) ? "NaN" : "Inf"));
    EXPECT_EQ(param, param_before);
    EXPECT_EQ(momentum, momentum_before);
  }
}

TEST(MuonStepTest, ExpertStackErrorsNameTheExpert) {
  std::vector<float> grad(3 * 4 * 4, 1.0f), param(48, 0.0f), momentum(48, 0.0f);
  grad[2 * 16] = std::numeric_limits<float>::infinity();
  MuonStack stack{{"moe.w1"},
                  Stack(grad, 3, 4, 4),
                  Stack(momentum, 3, 4, 4),
                  Stack(param, 3, 4, 4)};
  CpuKernels kernels;
  EXPECT_THAT(std::string(kernels.MuonStep(stack, {}, kHostStream).message()),
              HasSubstr("\"moe.w1\"[expert 2]"));
}

TEST(MuonStepTest, HugeGradientsStayFinite) {
  // 1e30 is far from FLT_MAX but its square is not representable in fp32.
  std::vector<float> grad = GaussianMatrix(12, 20, 4, 1e30f);
  std::vector<float> param(240, 1.0f), momentum(240, 0.0f);
  MuonStack stack{{"w"},
                  Stack(grad, 1, 12, 20),
                  Stack(momentum, 1, 12, 20),
                  Stack(param, 1, 12, 20)};
  CpuKernels kernels;
  ASSERT_TRUE(kernels.MuonStep(stack, {}, kHostStream).ok());
  for (float v : param) ASSERT_TRUE(std::isfinite(v));
  for (float v : momentum) ASSERT_TRUE(std::isfinite(v));
}

TEST(MuonStepTest, BadHyperparametersAreRejectedBeforeAnyWrite) {
  std::vector<float> grad(16, 1.0f), param(16, 2.0f), momentum(16, 3.0f);
  MuonStack stack{{"w"},
                  Stack(grad, 1, 4, 4),
                  Stack(momentum, 1, 4, 4),
                  Stack(param, 1, 4, 4)};
  MuonHyperparameters hyper;
  hyper.ns.steps = 0;
  CpuKernels kernels;
  EXPECT_THAT(
      std::string(kernels.MuonStep(stack, hyper, kHostStream).message()),
      HasSubstr("ns_steps"));
  EXPECT_EQ(param, std::vector<float>(16, 2.0f));
  EXPECT_EQ(momentum, std::vector<float>(16, 3.0f));
}

TEST(AdamWStepTest, MatchesFp64TwinOverTenSteps) {
  AdamWHyperparameters hyper;
  hyper.lr = 3e-3;
  hyper.beta2 = 0.95;
  hyper.weight_decay = 0.1;
  std::vector<float> param = GaussianMatrix(1, 500, 8);
  std::vector<float> m(500, 0.0f), v(500, 0.0f);
  reference::Matrix want_param(param.begin(), param.end());
  reference::Matrix want_m(500, 0.0), want_v(500, 0.0);
  CpuKernels kernels;
  for (int step = 1; step <= 10; ++step) {
    const std::vector<float> grad = GaussianMatrix(1, 500, 50 + step);
    const AdamWTensor tensor{"bias",   param.data(), grad.data(),
                             m.data(), v.data(),     500};
    ASSERT_TRUE(kernels.AdamWStep(tensor, hyper, step, kHostStream).ok());
    reference::AdamWStep(reference::Matrix(grad.begin(), grad.end()), hyper,
                         step, &want_m, &want_v, &want_param);
    EXPECT_LT(RelativeError(param, want_param), 1e-6) << step;
    EXPECT_LT(RelativeError(m, want_m), 1e-6) << step;
    EXPECT_LT(RelativeError(v, want_v), 1e-6) << step;
  }
}

TEST(AdamWStepTest, RejectsNonFiniteGradientAndBadStepWithoutWriting) {
  std::vector<float> param(10, 1.0f), m(10, 0.0f), v(10, 0.0f);
  std::vector<float> grad(10, 0.5f);
  grad[7] = std::numeric_limits<float>::quiet_NaN();
  CpuKernels kernels;
  const AdamWTensor tensor{"ln.weight", param.data(), grad.data(),
                           m.data(),    v.data(),     10};
  const absl::Status status = kernels.AdamWStep(tensor, {}, 1, kHostStream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"ln.weight\""));
  EXPECT_THAT(std::string(status.message()), HasSubstr("element 7"));
  EXPECT_EQ(param, std::vector<float>(10, 1.0f));
  EXPECT_EQ(m, std::vector<float>(10, 0.0f));
  grad[7] = 0.5f;
  EXPECT_THAT(
      std::string(kernels.AdamWStep(tensor, {}, 0, kHostStream).message()),
      HasSubstr("step"));
  EXPECT_EQ(param, std::vector<float>(10, 1.0f));
}

// The CPU backend works on host memory: a device stream is a caller's
// mistake, refused by name before any call reads or writes.
TEST(CpuKernelsTest, EveryCallRefusesADeviceStreamBeforeWriting) {
  std::vector<float> grad(16, 1.0f), param(16, 2.0f), momentum(16, 3.0f);
  std::vector<float> update(16, 4.0f), m(16, 0.0f), v(16, 0.0f);
  const MatrixStack g = Stack(grad, 1, 4, 4), p = Stack(param, 1, 4, 4);
  const MatrixStack b = Stack(momentum, 1, 4, 4), u = Stack(update, 1, 4, 4);
  CpuKernels kernels;
  alignas(8) char not_a_stream[8] = {};
  const Stream device = reinterpret_cast<Stream>(not_a_stream);
  const AdamWTensor tensor{"bias",   param.data(), grad.data(),
                           m.data(), v.data(),     16};
  const absl::Status refused[] = {
      kernels.CheckFinite(g, {"w"}, device),
      kernels.UpdateMomentum(g, b, b, 0.9, true, u, device),
      kernels.Orthogonalize(g, u, {}, device),
      kernels.ApplyUpdate(p, u, 0.1, 0.1, LrAdjustment::kOriginal, device),
      kernels.MuonStep({{"w"}, g, b, p}, {}, device),
      kernels.AdamWStep(tensor, {}, 1, device),
  };
  for (const absl::Status& status : refused) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("stream"));
  }
  EXPECT_EQ(param, std::vector<float>(16, 2.0f));
  EXPECT_EQ(momentum, std::vector<float>(16, 3.0f));
  EXPECT_EQ(update, std::vector<float>(16, 4.0f));
  EXPECT_EQ(m, std::vector<float>(16, 0.0f));
}

}  // namespace
}  // namespace kernels
}  // namespace muonps
