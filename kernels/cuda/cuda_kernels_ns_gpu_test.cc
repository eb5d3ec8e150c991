// Runs the CUDA backend's Newton-Schulz on a GPU against the CPU backend:
// NS5 and Gram, with and without Polar Express, on wide, tall and square
// batches and Llama-shaped slices, within the GEMM input precision's
// rounding; graphs on and off and new buffers give the same result. Needs
// a GPU: tagged manual, run on the GPU machine by deploy/device.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_kernels_gpu_test_util.h"
#include "kernels/cuda/host_staging_kernels.h"
#include "kernels/reference/reference_muon.h"
#include "kernels/reference/test_matrices.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

using cuda_kernels_test::Gpu;
using cuda_kernels_test::Options;
using cuda_kernels_test::RunNs;
using cuda_kernels_test::Shape;
using reference::GaussianMatrix;
using reference::RelativeError;

// Relative Frobenius bound on |GPU - CPU fp32| / |CPU| for one NS call.
// With u the unit roundoff of the GEMM inputs (2^-8 bf16, 2^-11 fp16), each
// NS5 step rounds B = b A + c A^2 to the input precision; |B| reaches ~2.7
// where the new iterate is (a + B) X ~ 0.7 X, so B's rounding (u / sqrt(3)
// RMS) moves the iterate by ~4 u / sqrt(3), and the quintic's slope
// (|phi'| ~ 1.3 near its fixed points) carries each step's error forward:
// over 5 steps about 4.3 x 4 u / sqrt(3) ~ 10 u (measured: up to 9 u). The
// bound allows 16 u; Polar Express's larger early coefficients (|B| / |a + B|
// up to ~6) get twice that. Gram NS carries R <- P R P across the steps of a
// segment instead of recomputing A from X, so the rounding of P enters R
// twice per step and compounds (measured: up to 19 u, 42 u with Polar
// Express): twice NS5's bounds. fp32 runs the same arithmetic as the CPU in
// another summation order: 2e-5 (the CPU backend's own fp64 check is
// 1e-5); Gram's compounding products, 2e-4.
double Bound(Precision p, const NewtonSchulzOptions& o) {
  double factor = o.polar_express ? 32 : 16;
  if (o.algorithm == NsAlgorithm::kGram) factor *= 2;
  switch (p) {
    case Precision::kBf16:
      return factor * std::ldexp(1.0, -8);
    case Precision::kFp16:
      return factor * std::ldexp(1.0, -11);
    case Precision::kFp32:
      return o.algorithm == NsAlgorithm::kGram ? 2e-4 : 2e-5;
  }
  return 0;
}

constexpr Precision kPrecisions[] = {Precision::kFp32, Precision::kBf16,
                                     Precision::kFp16};

TEST(CudaNsTest, MatchesCpuWithinInputRoundingOnWideTallSquareBatches) {
  const Shape shapes[] = {{3, 64, 256}, {2, 256, 64}, {4, 128, 128},
                          {2, 33, 97},  {2, 97, 33},  {1, 1, 300},
                          {3, 300, 1},  {2, 48, 200}};
  CpuKernels cpu;
  uint32_t seed = 1;
  for (const Precision p : kPrecisions) {
    auto gpu = Gpu(p);
    ASSERT_NE(gpu, nullptr);
    for (const Shape& s : shapes) {
      const std::vector<float> in =
          GaussianMatrix(s.count * s.rows, s.cols, seed++);
      for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
        for (const bool polar : {false, true}) {
          // Gram NS with Polar Express on square matrices (whose smallest
          // singular values are tiny) loses 0.6 (bf16) and 0.08 (fp16):
          // square matrices stay on NS5 (kernels/README.md); not a supported
          // pair.
          if (a == NsAlgorithm::kGram && polar && s.rows == s.cols &&
              p != Precision::kFp32) {
            continue;
          }
          const NewtonSchulzOptions o = Options(a, polar);
          const double err =
              RelativeError(RunNs(gpu.get(), in, s, o), RunNs(&cpu, in, s, o));
          std::printf("ns %s %s%s %lldx%lldx%lld rel_err %.3g\n",
                      std::string(PrecisionName(p)).c_str(),
                      std::string(NsAlgorithmName(a)).c_str(),
                      polar ? "+polar" : "", static_cast<long long>(s.count),
                      static_cast<long long>(s.rows),
                      static_cast<long long>(s.cols), err);
          EXPECT_LT(err, Bound(p, o))
              << PrecisionName(p) << " " << NsAlgorithmName(a) << " " << s.count
              << "x" << s.rows << "x" << s.cols << " polar " << polar;
        }
      }
    }
  }
}

TEST(CudaNsTest, LlamaShapedSlicesMatchCpuWithinInputRounding) {
  struct Case {
    Shape shape;
    NsAlgorithm algorithm;
  };
  const Case cases[] = {{{2, 1024, 4096}, NsAlgorithm::kGram},
                        {{1, 4096, 1024}, NsAlgorithm::kGram},
                        {{2, 1024, 1024}, NsAlgorithm::kNs5},
                        {{1, 768, 2304}, NsAlgorithm::kNs5}};
  CpuKernels cpu;
  uint32_t seed = 50;
  for (const Case& c : cases) {
    const Shape& s = c.shape;
    const std::vector<float> in =
        GaussianMatrix(s.count * s.rows, s.cols, seed++);
    const std::vector<float> want = RunNs(&cpu, in, s, Options(c.algorithm));
    for (const Precision p : {Precision::kBf16, Precision::kFp16}) {
      auto gpu = Gpu(p);
      ASSERT_NE(gpu, nullptr);
      const double err =
          RelativeError(RunNs(gpu.get(), in, s, Options(c.algorithm)), want);
      std::printf("large %s %s %lldx%lldx%lld rel_err %.3g\n",
                  std::string(PrecisionName(p)).c_str(),
                  std::string(NsAlgorithmName(c.algorithm)).c_str(),
                  static_cast<long long>(s.count),
                  static_cast<long long>(s.rows),
                  static_cast<long long>(s.cols), err);
      EXPECT_LT(err, Bound(p, Options(c.algorithm)))
          << PrecisionName(p) << " " << s.rows << "x" << s.cols;
    }
  }
}

TEST(CudaNsTest, GraphsOnOffAndNewBuffersGiveTheSameResult) {
  const Shape s{3, 96, 320};
  const std::vector<float> in = GaussianMatrix(s.count * s.rows, s.cols, 9);
  for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    auto eager = Gpu(Precision::kBf16, /*graphs=*/false);
    auto graphed = Gpu(Precision::kBf16, /*graphs=*/true);
    ASSERT_NE(eager, nullptr);
    ASSERT_NE(graphed, nullptr);
    const std::vector<float> want = RunNs(eager.get(), in, s, Options(a));
    // Twice through the same graph, then in place (other buffers, a new
    // graph): every result equals the eager one up to the order of the
    // norm's atomic additions.
    EXPECT_LT(RelativeError(RunNs(graphed.get(), in, s, Options(a)), want),
              1e-6);
    EXPECT_LT(RelativeError(RunNs(graphed.get(), in, s, Options(a)), want),
              1e-6);
    std::vector<float> data = in;
    const MatrixStack stack{data.data(), s.count, s.rows, s.cols};
    ASSERT_TRUE(
        graphed->Orthogonalize(stack, stack, Options(a), kHostStream).ok());
    EXPECT_LT(RelativeError(data, want), 1e-6);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
