// Checks the CPU Newton-Schulz kernels against their fp64 twin and Gram NS
// against NS5, on random, ill-conditioned, rank-deficient and edge-case
// inputs.
#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/reference/reference_muon.h"
#include "kernels/reference/test_matrices.h"

namespace muonps {
namespace kernels {
namespace {

using reference::GaussianMatrix;
using reference::GeometricSpectrum;
using reference::MatrixWithSpectrum;
using reference::RelativeError;

struct Shape {
  int64_t rows;
  int64_t cols;
};

std::vector<float> RunNs(const std::vector<float>& in, Shape s,
                         const NewtonSchulzOptions& options) {
  CpuKernels kernels(CpuKernelOptions{.threads = 1});
  std::vector<float> data = in;
  std::vector<float> out(in.size());
  const MatrixStack in_stack{data.data(), 1, s.rows, s.cols};
  const MatrixStack out_stack{out.data(), 1, s.rows, s.cols};
  EXPECT_TRUE(
      kernels.Orthogonalize(in_stack, out_stack, options, kHostStream).ok());
  return out;
}

reference::Matrix Fp64Ns(const std::vector<float>& in, Shape s,
                         const NewtonSchulzOptions& options) {
  return reference::NewtonSchulz(reference::Matrix(in.begin(), in.end()),
                                 s.rows, s.cols, options);
}

NewtonSchulzOptions Gram() {
  NewtonSchulzOptions options;
  options.algorithm = NsAlgorithm::kGram;
  return options;
}

bool AllFinite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

// Both orientations of several aspect ratios, including odd sizes.
const Shape kShapes[] = {{64, 64}, {64, 256}, {256, 64}, {33, 97},
                         {97, 33}, {32, 512}, {512, 32}, {128, 128}};

TEST(Ns5Test, Fp32MatchesFp64TwinWithin1e5OnGaussianInputs) {
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    const std::vector<float> in = GaussianMatrix(s.rows, s.cols, seed++);
    const double err = RelativeError(RunNs(in, s, {}), Fp64Ns(in, s, {}));
    EXPECT_LT(err, 1e-5) << s.rows << "x" << s.cols;
  }
}

TEST(Ns5Test, Fp32MatchesFp64TwinWithin1e5OnIllConditionedInputs) {
  uint32_t seed = 100;
  for (const Shape& s : kShapes) {
    const int k = static_cast<int>(std::min(s.rows, s.cols));
    const std::vector<float> in = MatrixWithSpectrum(
        s.rows, s.cols, GeometricSpectrum(k, 1.0, 1e-6), seed++);
    const double err = RelativeError(RunNs(in, s, {}), Fp64Ns(in, s, {}));
    EXPECT_LT(err, 1e-5) << s.rows << "x" << s.cols;
  }
}

TEST(GramNsTest, MatchesNs5Within1e4ForAspectRatios1And4And16) {
  uint32_t seed = 7;
  for (const int64_t m : {32, 64, 96}) {
    for (const int64_t ratio : {1, 4, 16}) {
      for (const bool tall : {false, true}) {
        const Shape s = tall ? Shape{m * ratio, m} : Shape{m, m * ratio};
        const std::vector<float> in = GaussianMatrix(s.rows, s.cols, seed++);
        const double err =
            RelativeError(RunNs(in, s, Gram()), RunNs(in, s, {}));
        EXPECT_LT(err, 1e-4) << s.rows << "x" << s.cols;
      }
    }
  }
}

TEST(GramNsTest, MatchesFp64TwinOnIllConditionedAndRankDeficientInputs) {
  uint32_t seed = 300;
  for (const Shape& s : kShapes) {
    const int k = static_cast<int>(std::min(s.rows, s.cols));
    for (const int rank : {k, k / 2, 1}) {
      const std::vector<float> in = MatrixWithSpectrum(
          s.rows, s.cols, GeometricSpectrum(rank, 1.0, 1e-6), seed++);
      const std::vector<float> out = RunNs(in, s, Gram());
      ASSERT_TRUE(AllFinite(out)) << s.rows << "x" << s.cols;
      EXPECT_LT(RelativeError(out, Fp64Ns(in, s, {})), 1e-4)
          << s.rows << "x" << s.cols << " rank " << rank;
    }
  }
}

TEST(GramNsTest, RestartScheduleDoesNotChangeTheResultBeyondRounding) {
  const Shape s{48, 400};
  const std::vector<float> in = GaussianMatrix(s.rows, s.cols, 11);
  const reference::Matrix want = Fp64Ns(in, s, {});
  for (const std::vector<int>& restarts :
       {std::vector<int>{}, std::vector<int>{1}, std::vector<int>{2},
        std::vector<int>{1, 2, 3, 4}, std::vector<int>{5, 9}}) {
    NewtonSchulzOptions options = Gram();
    options.gram_restarts = restarts;
    EXPECT_LT(RelativeError(RunNs(in, s, options), want), 1e-4)
        << restarts.size() << " restarts";
  }
}

TEST(NsEdgeCaseTest, ZeroMatrixGivesZeroWithoutNaN) {
  for (const NewtonSchulzOptions& options : {NewtonSchulzOptions{}, Gram()}) {
    const std::vector<float> out =
        RunNs(std::vector<float>(12 * 20, 0.0f), {12, 20}, options);
    for (float v : out) ASSERT_EQ(v, 0.0f);
  }
}

TEST(NsEdgeCaseTest, RowAndColumnVectorsMatchFp64Twin) {
  for (const Shape s : {Shape{1, 300}, Shape{300, 1}, Shape{1, 1}}) {
    const std::vector<float> in = GaussianMatrix(s.rows, s.cols, 5);
    for (const NewtonSchulzOptions& options : {NewtonSchulzOptions{}, Gram()}) {
      EXPECT_LT(RelativeError(RunNs(in, s, options), Fp64Ns(in, s, {})), 1e-5)
          << s.rows << "x" << s.cols;
    }
  }
}

TEST(NsEdgeCaseTest, ValuesNearFp32LimitsGiveTheScaleFreeResult) {
  const Shape s{40, 90};
  const std::vector<float> unit = GaussianMatrix(s.rows, s.cols, 9);
  const reference::Matrix want = Fp64Ns(unit, s, {});
  // Scale invariance: NS(t X) = NS(X) while ||t X||_F > eps. At 1e37 the
  // norm (6e38) exceeds FLT_MAX and a naive fp32 sum of squares overflows;
  // 1e-6 leaves the norm (6e-5) just above eps.
  for (const float scale : {1e37f, 1e-6f}) {
    std::vector<float> in = unit;
    for (float& v : in) v *= scale;
    for (const NewtonSchulzOptions& options : {NewtonSchulzOptions{}, Gram()}) {
      const std::vector<float> out = RunNs(in, s, options);
      ASSERT_TRUE(AllFinite(out)) << scale;
      EXPECT_LT(RelativeError(out, want), 1e-5) << scale;
    }
  }
  // Below eps the norm is clamped (as torch does): the output shrinks with
  // the input instead of blowing up, and still matches the fp64 twin.
  std::vector<float> tiny = unit;
  for (float& v : tiny) v *= 1e-37f;
  for (const NewtonSchulzOptions& options : {NewtonSchulzOptions{}, Gram()}) {
    const std::vector<float> out = RunNs(tiny, s, options);
    ASSERT_TRUE(AllFinite(out));
    EXPECT_LT(RelativeError(out, Fp64Ns(tiny, s, {})), 1e-5);
  }
}

// ||O O^T - I||_F / sqrt(m) for the wide orientation of `o`.
double OrthogonalityDefect(const std::vector<float>& o, Shape s) {
  const bool tall = s.rows > s.cols;
  const int64_t m = std::min(s.rows, s.cols);
  const int64_t n = std::max(s.rows, s.cols);
  reference::Matrix x(o.begin(), o.end());
  if (tall) x = reference::Transpose(x, s.rows, s.cols);
  const reference::Matrix g =
      reference::MatMul(x, reference::Transpose(x, m, n), m, n, m);
  double sum = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      const double d = g[i * m + j] - (i == j ? 1.0 : 0.0);
      sum += d * d;
    }
  }
  return std::sqrt(sum / m);
}

TEST(PolarExpressTest, ConvergesWhereTheQuinticOscillates) {
  const Shape s{64, 256};
  const std::vector<float> in =
      MatrixWithSpectrum(s.rows, s.cols, GeometricSpectrum(64, 1.0, 1e-2), 21);
  NewtonSchulzOptions polar;
  polar.polar_express = true;
  const double quintic_defect = OrthogonalityDefect(RunNs(in, s, {}), s);
  const double polar_defect = OrthogonalityDefect(RunNs(in, s, polar), s);
  // Measured: 0.18 against 0.35 after 5 steps; 6e-6 against 0.37 after 7.
  EXPECT_LT(polar_defect, 0.6 * quintic_defect);
  NewtonSchulzOptions polar7 = polar;
  polar7.steps = 7;
  EXPECT_LT(OrthogonalityDefect(RunNs(in, s, polar7), s), 1e-4);
  NewtonSchulzOptions polar_gram = polar;
  polar_gram.algorithm = NsAlgorithm::kGram;
  EXPECT_LT(RelativeError(RunNs(in, s, polar_gram), Fp64Ns(in, s, polar)),
            1e-4);
  EXPECT_LT(RelativeError(RunNs(in, s, polar), Fp64Ns(in, s, polar)), 1e-5);
}

TEST(PolarExpressTest, StepsPastTheTableRepeatTheFixedPoint) {
  NewtonSchulzOptions polar;
  polar.polar_express = true;
  const NsCoefficients last = CoefficientsForStep(polar, 7);
  const NsCoefficients later = CoefficientsForStep(polar, 40);
  EXPECT_EQ(last.a, 1.875);
  EXPECT_EQ(later.a, last.a);
  EXPECT_EQ(later.b, last.b);
  EXPECT_EQ(later.c, last.c);
  // The safety factor 1.01 divides a once, b three times, c five times.
  const NsCoefficients first = CoefficientsForStep(polar, 0);
  EXPECT_NEAR(first.a * 1.01, 8.28721201814563, 1e-12);
  EXPECT_NEAR(first.b * std::pow(1.01, 3), -23.595886519098837, 1e-12);
  EXPECT_NEAR(first.c * std::pow(1.01, 5), 17.300387312530933, 1e-12);
}

}  // namespace
}  // namespace kernels
}  // namespace muonps
