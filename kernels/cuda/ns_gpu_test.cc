// Runs the GPU Newton-Schulz engine directly on device memory: the three
// symmetric-product plans agree; Gram NS stays finite and within tolerance
// of the fp64 twin on ill-conditioned inputs (singular values spread
// log-uniformly over 1e-6..1) and rank-deficient ones, in every precision,
// with R's diagonal staying healthy under the scheduled restart; inputs near
// the fp32 limits and zero inputs behave as on the CPU. Needs a GPU: tagged
// manual, run on the GPU machine by deploy/device.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ns_engine.h"
#include "kernels/cuda/wgmma_lower.h"
#include "kernels/reference/reference_muon.h"
#include "kernels/reference/test_matrices.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

using reference::GaussianMatrix;
using reference::GeometricSpectrum;
using reference::MatrixWithSpectrum;
using reference::RelativeError;

struct Shape {
  int64_t rows, cols;
};

class NsEngineTest : public ::testing::Test {
 protected:
  // Handles and workspaces for two lanes; the engine points each handle
  // at its stream and workspace itself.
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              cudaSuccess)
        << "this test needs a CUDA GPU";
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    auto ws = DeviceBuffer::Allocate(64 << 20, "cuBLAS workspace");
    ASSERT_TRUE(ws.ok()) << ws.status();
    workspace_ = std::move(*ws);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking),
              cudaSuccess);
    ASSERT_EQ(cublasCreate(&side_handle_), CUBLAS_STATUS_SUCCESS);
    auto side = DeviceBuffer::Allocate(64 << 20, "second cuBLAS workspace");
    ASSERT_TRUE(side.ok()) << side.status();
    side_workspace_ = std::move(*side);
  }
  void TearDown() override {
    cublasDestroy(side_handle_);
    cudaStreamDestroy(side_stream_);
    cublasDestroy(handle_);
    cudaStreamDestroy(stream_);
  }

  // NS of `count` matrices (stored back to back in `in`) on a fresh engine.
  std::vector<float> Run(cudaDataType low, const SymmetricPlan& plan,
                         const std::vector<float>& in, int64_t count, Shape s,
                         const NewtonSchulzOptions& options,
                         unsigned int* drift = nullptr, int lanes = 1) {
    std::vector<NsLane> lane_list = {
        {handle_, workspace_.get(), workspace_.bytes()}};
    if (lanes == 2) {
      lane_list.push_back({side_handle_, side_workspace_.get(),
                           side_workspace_.bytes(), side_stream_});
    }
    NsEngine engine(lane_list, low, plan, /*use_graphs=*/true);
    const size_t bytes = in.size() * sizeof(float);
    auto x = DeviceBuffer::Allocate(bytes, "input");
    auto y = DeviceBuffer::Allocate(bytes, "output");
    EXPECT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(cudaMemcpy(x->get(), in.data(), bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
    const absl::Status status =
        engine.Run(x->as<float>(), y->as<float>(), count, s.rows, s.cols,
                   options, stream_);
    EXPECT_TRUE(status.ok()) << status;
    std::vector<float> out(in.size());
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), y->get(), bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    if (drift != nullptr && options.algorithm == NsAlgorithm::kGram) {
      const absl::StatusOr<unsigned int> d =
          engine.DriftCount(count, s.rows, s.cols);
      EXPECT_TRUE(d.ok()) << d.status();
      *drift = d.ok() ? *d : 1;
    }
    return out;
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  cudaStream_t side_stream_ = nullptr;
  cublasHandle_t side_handle_ = nullptr;
  DeviceBuffer side_workspace_;
};

NewtonSchulzOptions Gram() {
  NewtonSchulzOptions o;
  o.algorithm = NsAlgorithm::kGram;
  return o;
}

reference::Matrix Fp64Ns(const std::vector<float>& in, Shape s) {
  return reference::NewtonSchulz(reference::Matrix(in.begin(), in.end()),
                                 s.rows, s.cols, {});
}

bool AllFinite(const std::vector<float>& v) {
  for (const float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

TEST_F(NsEngineTest, DenseRowBlockAndTilePlansAgreeWithinFp32Rounding) {
  const SymmetricPlan dense{SymmetricMode::kDense, 1, 1};
  const SymmetricPlan rows{SymmetricMode::kRowBlocks, 4, 32};
  const SymmetricPlan tiles{SymmetricMode::kTiles, 4, 32};
  const SymmetricPlan lt_tiles{SymmetricMode::kLtTiles, 4, 32};
  uint32_t seed = 1;
  for (const Shape s : {Shape{256, 640}, Shape{640, 256}, Shape{200, 200}}) {
    const std::vector<float> in = GaussianMatrix(3 * s.rows, s.cols, seed++);
    for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
      NewtonSchulzOptions o;
      o.algorithm = a;
      const std::vector<float> want = Run(CUDA_R_32F, dense, in, 3, s, o);
      for (const SymmetricPlan& plan : {rows, tiles, lt_tiles}) {
        EXPECT_LT(RelativeError(Run(CUDA_R_32F, plan, in, 3, s, o), want), 2e-5)
            << s.rows << "x" << s.cols << " mode "
            << static_cast<int>(plan.mode);
      }
      // In bf16 the plans differ in fp32 summation order, which flips some
      // roundings to bf16: within the random-input bound of
      // cuda_kernels_gpu_test (16 u).
      const std::vector<float> bf16 = Run(CUDA_R_16BF, dense, in, 3, s, o);
      EXPECT_LT(RelativeError(Run(CUDA_R_16BF, tiles, in, 3, s, o), bf16),
                16 * std::ldexp(1.0, -8));
      EXPECT_LT(RelativeError(Run(CUDA_R_16BF, lt_tiles, in, 3, s, o), bf16),
                16 * std::ldexp(1.0, -8));
    }
  }
}

// The Hopper kernel with its fused combine (SymmetricMode::kWgmma) against
// cuBLAS's tiles and the combine pass: the same iteration up to fp32
// summation order, on shapes with and without its 128-row tiles, wide and
// tall (whose X X^T stays on cuBLAS), in both 16-bit types.
TEST_F(NsEngineTest, WgmmaPlanAgreesWithCublasTiles) {
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  if (!WgmmaLowerSupported(device, CUDA_R_16BF, 128, 64)) {
    GTEST_SKIP() << "not an sm_90 GPU";
  }
  const SymmetricPlan tiles{SymmetricMode::kTiles, 4, 32};
  const SymmetricPlan wgmma{SymmetricMode::kWgmma, 4, 32};
  uint32_t seed = 11;
  for (const Shape s : {Shape{256, 640}, Shape{640, 256}, Shape{384, 1000},
                        Shape{1024, 1024}}) {
    const std::vector<float> in = GaussianMatrix(3 * s.rows, s.cols, seed++);
    for (const cudaDataType low : {CUDA_R_16BF, CUDA_R_16F}) {
      const double u = std::ldexp(1.0, low == CUDA_R_16BF ? -8 : -11);
      for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
        NewtonSchulzOptions o;
        o.algorithm = a;
        unsigned int drift = 0;
        const std::vector<float> want = Run(low, tiles, in, 3, s, o);
        const std::vector<float> got = Run(low, wgmma, in, 3, s, o, &drift);
        EXPECT_LT(RelativeError(got, want), 16 * u)
            << s.rows << "x" << s.cols << " " << NsAlgorithmName(a)
            << (low == CUDA_R_16BF ? " bf16" : " fp16");
        EXPECT_EQ(drift, 0u);
      }
    }
  }
}

TEST_F(NsEngineTest, TwoLanesComputeWhatOneLaneComputes) {
  const SymmetricPlan plan{SymmetricMode::kTiles, 4, 32};
  const Shape s{128, 384};
  const std::vector<float> in = GaussianMatrix(5 * s.rows, s.cols, 77);
  for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    NewtonSchulzOptions o;
    o.algorithm = a;
    // 5 matrices split 3 + 2: each half's batched GEMMs may pick other
    // kernels, so fp32 results agree to rounding, not bit for bit.
    const std::vector<float> one = Run(CUDA_R_32F, plan, in, 5, s, o);
    unsigned int drift = 1;
    const std::vector<float> two =
        Run(CUDA_R_32F, plan, in, 5, s, o, &drift, /*lanes=*/2);
    EXPECT_LT(RelativeError(two, one), 2e-5) << NsAlgorithmName(a);
    if (a == NsAlgorithm::kGram) {
      EXPECT_EQ(drift, 0u);
    }
  }
}

// Relative Frobenius error against the fp64 NS5 twin on inputs whose
// singular values spread over 1e-6..1 (full rank), or with half or all but
// one of them zero. fp32: 2e-4 (fp32 rounding in directions a rank-1 input
// does not span grows by a^5 ~ 483: measured 1.1e-4 for both algorithms).
// 16-bit inputs (unit roundoff
// u): NS5 keeps X in fp32 and its polynomial B vanishes in directions the
// input does not span, so it stays within the random-input bound of 16 u
// (measured 2 u). Gram NS multiplies its last segment's 16-bit X copy by Q,
// whose eigenvalue in those directions is the segment's product of `a`
// (3.4445^3 ~ 41 after the default restart): rounding noise of u / sqrt(3)
// there grows to ~24 u, on top of Gram's own ~19 u on random inputs
// (cuda_kernels_gpu_test); measured up to 49 u (bf16) and 68 u (fp16) at
// rank 1. The bound allows 80 u: finite and bounded, but NS5 is the accurate
// choice for such inputs in 16-bit.
double IllConditionedBound(cudaDataType low, NsAlgorithm algorithm) {
  const bool gram = algorithm == NsAlgorithm::kGram;
  const double factor = gram ? 80 : 16;
  switch (low) {
    case CUDA_R_16BF:
      return factor * std::ldexp(1.0, -8);
    case CUDA_R_16F:
      return factor * std::ldexp(1.0, -11);
    default:
      return 2e-4;
  }
}

TEST_F(NsEngineTest, GramIsFiniteAndAccurateOnIllConditionedAndLowRank) {
  const SymmetricPlan plan{SymmetricMode::kTiles, 4, 32};
  uint32_t seed = 300;
  for (const Shape s :
       {Shape{64, 256}, Shape{256, 64}, Shape{128, 512}, Shape{96, 96}}) {
    const int k = static_cast<int>(std::min(s.rows, s.cols));
    for (const int rank : {k, k / 2, 1}) {
      const std::vector<float> in = MatrixWithSpectrum(
          s.rows, s.cols, GeometricSpectrum(rank, 1.0, 1e-6), seed++);
      const reference::Matrix want = Fp64Ns(in, s);
      for (const cudaDataType low : {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F}) {
        for (const NsAlgorithm a : {NsAlgorithm::kGram, NsAlgorithm::kNs5}) {
          NewtonSchulzOptions o;
          o.algorithm = a;
          unsigned int drift = 0;
          const std::vector<float> out = Run(low, plan, in, 1, s, o, &drift);
          ASSERT_TRUE(AllFinite(out)) << s.rows << "x" << s.cols;
          const double err = RelativeError(out, want);
          std::printf(
              "illcond %s low=%d %lldx%lld rank %d rel_err %.3g "
              "drift %u\n",
              std::string(NsAlgorithmName(a)).c_str(), static_cast<int>(low),
              static_cast<long long>(s.rows), static_cast<long long>(s.cols),
              rank, err, drift);
          EXPECT_LT(err, IllConditionedBound(low, a))
              << NsAlgorithmName(a) << " type " << low << " " << s.rows << "x"
              << s.cols << " rank " << rank;
          // The CPU backend would restart on an unhealthy diagonal; the
          // schedule must keep R healthy so both backends run the same steps.
          EXPECT_EQ(drift, 0u) << "type " << low << " rank " << rank;
        }
      }
    }
  }
}

// Gram NS with restarts after steps 1, 3 and 4 (segments of 1, 2, 1 and 1
// steps, D = Q - c I applied in each; see GramNs in ns_iteration.cc)
// against NS5 in the same 16-bit precision, on the rank-deficient inputs
// of the test above plus a larger shape: the largest Gram error stays
// within 4 times the largest NS5 error (a CPU emulation of these roundings
// measured 2.3x in bf16 and 2.6x in fp16; restarts after 2 and 3 measured
// 4.7x and 4.4x on an H100; the default single restart 29x and 30x there,
// printed here for the record).
TEST_F(NsEngineTest, GramWithRestarts134IsWithin4xOfNs5OnRankDeficientInputs) {
  const SymmetricPlan plan{SymmetricMode::kTiles, 4, 32};
  NewtonSchulzOptions accurate = Gram();
  accurate.gram_restarts = {1, 3, 4};
  for (const cudaDataType low : {CUDA_R_16BF, CUDA_R_16F}) {
    double ns5_max = 0, gram_max = 0, default_max = 0;
    uint32_t seed = 700;
    for (const Shape s : {Shape{64, 256}, Shape{256, 64}, Shape{128, 512},
                          Shape{96, 96}, Shape{256, 1024}}) {
      const int k = static_cast<int>(std::min(s.rows, s.cols));
      for (const int rank : {k / 2, 1}) {
        const std::vector<float> in = MatrixWithSpectrum(
            s.rows, s.cols, GeometricSpectrum(rank, 1.0, 1e-6), seed++);
        const reference::Matrix want = Fp64Ns(in, s);
        const double ns5 = RelativeError(
            Run(low, plan, in, 1, s, NewtonSchulzOptions{}), want);
        unsigned int drift = 0;
        const std::vector<float> out =
            Run(low, plan, in, 1, s, accurate, &drift);
        ASSERT_TRUE(AllFinite(out));
        const double gram = RelativeError(out, want);
        const double gram_default =
            RelativeError(Run(low, plan, in, 1, s, Gram()), want);
        std::printf(
            "rank-deficient low=%d %lldx%lld rank %d: ns5 %.3g gram(1,3,4) "
            "%.3g "
            "(%.2fx) gram(2) %.3g (%.2fx) drift %u\n",
            static_cast<int>(low), static_cast<long long>(s.rows),
            static_cast<long long>(s.cols), rank, ns5, gram, gram / ns5,
            gram_default, gram_default / ns5, drift);
        EXPECT_EQ(drift, 0u);
        ns5_max = std::max(ns5_max, ns5);
        gram_max = std::max(gram_max, gram);
        default_max = std::max(default_max, gram_default);
      }
    }
    std::printf(
        "rank-deficient low=%d max: ns5 %.3g gram(1,3,4) %.3g (%.2fx) "
        "gram(2) %.3g (%.2fx)\n",
        static_cast<int>(low), ns5_max, gram_max, gram_max / ns5_max,
        default_max, default_max / ns5_max);
    EXPECT_LT(gram_max, 4 * ns5_max) << "type " << low;
  }
}

// AOL (NewtonSchulzOptions::aol) on the GPU: its fp32 path matches the fp64
// twin for both algorithms and both orientations, its 16-bit paths stay
// within the random-input bounds, and Polar Express in 4 steps with AOL is
// as close to the exact polar factor U V^T as 5 steps without (bf16).
TEST_F(NsEngineTest, AolMatchesItsFp64TwinAndSavesAPolarExpressStep) {
  const SymmetricPlan plan{SymmetricMode::kTiles, 4, 32};
  uint32_t seed = 800;
  for (const Shape s : {Shape{128, 384}, Shape{384, 128}, Shape{40, 90}}) {
    const std::vector<float> in = GaussianMatrix(2 * s.rows, s.cols, seed++);
    for (const bool polar : {false, true}) {
      NewtonSchulzOptions o;
      o.aol = true;
      o.steps = 4;
      o.polar_express = polar;
      const std::vector<float> first(in.begin(), in.begin() + s.rows * s.cols);
      const reference::Matrix want = reference::NewtonSchulz(
          reference::Matrix(first.begin(), first.end()), s.rows, s.cols, o);
      for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
        o.algorithm = a;
        for (const cudaDataType low : {CUDA_R_32F, CUDA_R_16BF}) {
          std::vector<float> out = Run(low, plan, in, 2, s, o);
          out.resize(s.rows * s.cols);
          const double err = RelativeError(out, want);
          std::printf("aol %s polar=%d low=%d %lldx%lld rel_err %.3g\n",
                      std::string(NsAlgorithmName(a)).c_str(), polar,
                      static_cast<int>(low), static_cast<long long>(s.rows),
                      static_cast<long long>(s.cols), err);
          const double bound =
              low == CUDA_R_32F
                  ? (a == NsAlgorithm::kGram ? 1e-4 : 2e-5)
                  : (a == NsAlgorithm::kGram ? 80 : 16) * std::ldexp(1.0, -8);
          EXPECT_LT(err, bound)
              << NsAlgorithmName(a) << " polar " << polar << " low " << low;
        }
      }
    }
  }
  const Shape s{128, 512};
  const std::vector<float> in = GaussianMatrix(s.rows, s.cols, 31);
  const reference::Matrix polar = reference::PolarFactor(
      reference::Matrix(in.begin(), in.end()), s.rows, s.cols);
  NewtonSchulzOptions pe5;
  pe5.polar_express = true;
  NewtonSchulzOptions aol4 = pe5;
  aol4.steps = 4;
  aol4.aol = true;
  const double e5 = RelativeError(Run(CUDA_R_16BF, plan, in, 1, s, pe5), polar);
  const double a4 =
      RelativeError(Run(CUDA_R_16BF, plan, in, 1, s, aol4), polar);
  std::printf("aol bf16 128x512 from U V^T: pe5 %.4f aol+pe4 %.4f\n", e5, a4);
  EXPECT_LT(a4, 1.5 * e5);
}

TEST_F(NsEngineTest, ValuesNearFp32LimitsAndZerosBehaveAsOnTheCpu) {
  const Shape s{40, 90};
  const SymmetricPlan plan{};
  const std::vector<float> unit = GaussianMatrix(s.rows, s.cols, 9);
  const reference::Matrix want = Fp64Ns(unit, s);
  for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    NewtonSchulzOptions o;
    o.algorithm = a;
    for (const float scale : {1e37f, 1e-6f}) {
      std::vector<float> in = unit;
      for (float& v : in) v *= scale;
      const std::vector<float> out = Run(CUDA_R_32F, plan, in, 1, s, o);
      ASSERT_TRUE(AllFinite(out)) << scale;
      EXPECT_LT(RelativeError(out, want), a == NsAlgorithm::kGram ? 1e-4 : 1e-5)
          << scale;
      ASSERT_TRUE(AllFinite(Run(CUDA_R_16F, plan, in, 1, s, o))) << scale;
    }
    const std::vector<float> zeros =
        Run(CUDA_R_16BF, plan, std::vector<float>(3 * 12 * 20, 0.0f), 3,
            {12, 20}, o);
    for (const float v : zeros) ASSERT_EQ(v, 0.0f);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
