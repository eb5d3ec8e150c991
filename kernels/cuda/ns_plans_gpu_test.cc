// Runs the GPU Newton-Schulz engine directly on device memory: the
// symmetric-product plans (dense, row blocks, cuBLAS and cuBLASLt tiles)
// agree within rounding, and two lanes
// compute what one lane computes. Needs a GPU: tagged manual, run on the
// GPU machine by deploy/device.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/ns_engine.h"
#include "kernels/cuda/ns_engine_fixture.h"
#include "kernels/reference/reference_muon.h"
#include "kernels/reference/test_matrices.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

using ns_test::NsEngineTest;
using ns_test::Shape;
using reference::GaussianMatrix;
using reference::RelativeError;

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
      // cuda_kernels_ns_gpu_test (16 u).
      const std::vector<float> bf16 = Run(CUDA_R_16BF, dense, in, 3, s, o);
      EXPECT_LT(RelativeError(Run(CUDA_R_16BF, tiles, in, 3, s, o), bf16),
                16 * std::ldexp(1.0, -8));
      EXPECT_LT(RelativeError(Run(CUDA_R_16BF, lt_tiles, in, 3, s, o), bf16),
                16 * std::ldexp(1.0, -8));
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

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
