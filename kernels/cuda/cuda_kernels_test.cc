// Host-side checks of the CUDA backend that need no GPU (they run in CI):
// precision names, the symmetric-product plan choice, the GEMM shapes the
// products run as, fp16 storage scales, and that creating the backend where
// no GPU is usable fails with a clean status (never a crash). On a GPU
// machine Create() must succeed instead.
#include "kernels/cuda/cuda_kernels.h"

#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/host_staging_kernels.h"
#include "kernels/cuda/ns_iteration.h"
#include "kernels/cuda/symmetric_gemm.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

bool GpuPresent() {
  int devices = 0;
  const bool present =
      cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  return present;
}

TEST(PrecisionTest, ParsesEveryNameAndRoundTrips) {
  for (const Precision p :
       {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    const absl::StatusOr<Precision> parsed = ParsePrecision(PrecisionName(p));
    ASSERT_TRUE(parsed.ok()) << PrecisionName(p);
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(PrecisionName(Precision::kBf16), "bf16");
}

TEST(PrecisionTest, RejectsUnknownNamesNamingTheField) {
  for (const char* name : {"", "tf32", "BF16", "fp8"}) {
    const absl::StatusOr<Precision> parsed = ParsePrecision(name);
    ASSERT_FALSE(parsed.ok()) << name;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("precision"));
  }
}

TEST(SymmetricPlanTest, BlocksShrinkToKeepRowsAndTilesNeedEvenSplits) {
  const SymmetricPlan tiles{SymmetricMode::kTiles, 4, 256};
  EXPECT_EQ(EffectivePlan(tiles, 4096).mode, SymmetricMode::kTiles);
  EXPECT_EQ(EffectivePlan(tiles, 4096).blocks, 4);
  // 1024 rows allow 4 blocks of 256; 640 rows only 2; 300 rows none.
  EXPECT_EQ(EffectivePlan(tiles, 1024).blocks, 4);
  EXPECT_EQ(EffectivePlan(tiles, 640).blocks, 2);
  EXPECT_EQ(EffectivePlan(tiles, 640).mode, SymmetricMode::kTiles);
  EXPECT_EQ(EffectivePlan(tiles, 300).mode, SymmetricMode::kDense);
  // 600 / 2 = 300 rows is not a multiple of 8: row blocks instead.
  EXPECT_EQ(EffectivePlan(tiles, 600).mode, SymmetricMode::kRowBlocks);
  EXPECT_EQ(EffectivePlan(tiles, 600).blocks, 2);
  EXPECT_EQ(EffectivePlan({SymmetricMode::kDense, 8, 1}, 4096).mode,
            SymmetricMode::kDense);
  // cuBLASLt tiles need the same even split, and fall back the same way.
  const SymmetricPlan lt{SymmetricMode::kLtTiles, 8, 256};
  EXPECT_EQ(EffectivePlan(lt, 4096).mode, SymmetricMode::kLtTiles);
  EXPECT_EQ(EffectivePlan(lt, 4096).blocks, 8);
  EXPECT_EQ(EffectivePlan(lt, 1024).blocks, 4);
  EXPECT_EQ(EffectivePlan(lt, 600).mode, SymmetricMode::kRowBlocks);
  EXPECT_EQ(EffectivePlan(lt, 300).mode, SymmetricMode::kDense);
}

// A combine's output that is one of the product's inputs would be read
// half-written: aliasing is refused on every plan, before any GPU call (so
// no handle is needed here).
TEST(SymmetricPlanTest, ProductCombineRefusesAnOutputThatIsAnInput) {
  float storage[64];
  const StackOperand l{storage, 64, 8, true};
  const StackOperand r{storage + 16, 64, 8, true};
  ProductCombine combine;
  combine.value_low = storage + 16;
  for (const SymmetricMode mode :
       {SymmetricMode::kTiles, SymmetricMode::kLtTiles,
        SymmetricMode::kRowBlocks, SymmetricMode::kDense}) {
    const absl::Status s =
        LowerProductCombine(nullptr, {mode, 4, 256}, CUDA_R_16BF, 1, 8, 8, 1.0f,
                            l, r, 0.0f, storage + 32, nullptr, combine);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("value_low is the input r"));
  }
  combine.value_low = nullptr;
  combine.other = storage + 48;
  combine.with_diag_low = storage + 48;
  const absl::Status s = LowerProductCombine(
      nullptr, {SymmetricMode::kLtTiles, 4, 256}, CUDA_R_16BF, 1, 8, 8, 1.0f, l,
      r, 0.0f, storage + 32, nullptr, combine);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("with_diag_low is the input other"));
}

// LeftMultiply's product as the column-major GEMM that LtGemm and
// CublasGemm run: a row-major wide W (m x n) is Y^T = W^T Q, n x m with W
// as A; a tall row-major stack (its wide view column-major) is Y = Q W,
// m x n with Q as A. Strides step whole matrices.
TEST(GemmShapeTest, LeftMultiplyMapsBothLayoutsToOneColumnMajorGemm) {
  const int64_t count = 3, m = 64, n = 256;
  const char q[1] = {0}, w[1] = {0};
  const StackOperand wide{w, m * n, n, true};
  const LtGemm::Shape a =
      LeftMultiplyShape(CUDA_R_16BF, CUDA_R_32F, count, m, n, wide);
  EXPECT_TRUE(a.strided);
  EXPECT_EQ(a.ta, CUBLAS_OP_N);
  EXPECT_EQ(a.tb, CUBLAS_OP_N);
  EXPECT_EQ(std::vector<int64_t>({a.m, a.n, a.k, a.lda, a.ldb, a.ldc}),
            std::vector<int64_t>({n, m, m, n, m, n}));
  EXPECT_EQ(std::vector<int64_t>({a.stride_a, a.stride_b, a.stride_c}),
            std::vector<int64_t>({m * n, m * m, m * n}));
  EXPECT_EQ(a.batch, count);
  EXPECT_EQ(LeftMultiplyA(q, wide), w);
  EXPECT_EQ(LeftMultiplyB(q, wide), q);

  const StackOperand tall{w, m * n, m, false};
  const LtGemm::Shape b =
      LeftMultiplyShape(CUDA_R_16F, CUDA_R_32F, count, m, n, tall);
  EXPECT_EQ(b.input_type, CUDA_R_16F);
  EXPECT_EQ(std::vector<int64_t>({b.m, b.n, b.k, b.lda, b.ldb, b.ldc}),
            std::vector<int64_t>({m, n, m, m, m, m}));
  EXPECT_EQ(std::vector<int64_t>({b.stride_a, b.stride_b, b.stride_c}),
            std::vector<int64_t>({m * m, m * n, m * n}));
  EXPECT_EQ(LeftMultiplyA(q, tall), q);
  EXPECT_EQ(LeftMultiplyB(q, tall), w);
}

// LowerProduct's tiles as one pointer-array GEMM of t x t tiles over k,
// written into c of m columns; row-major operands are read transposed as A.
TEST(GemmShapeTest, TileShapeIsAPointerArrayOfSquareTiles) {
  const char x[1] = {0};
  const StackOperand rows{x, 128 * 512, 512, true};
  const LtGemm::Shape s = TileShape(CUDA_R_16BF, 128, 32, 512, rows, rows, 30);
  EXPECT_FALSE(s.strided);
  EXPECT_EQ(s.ta, CUBLAS_OP_T);
  EXPECT_EQ(s.tb, CUBLAS_OP_N);
  EXPECT_EQ(std::vector<int64_t>({s.m, s.n, s.k, s.lda, s.ldb, s.ldc}),
            std::vector<int64_t>({32, 32, 512, 512, 512, 128}));
  EXPECT_EQ(s.batch, 30);
  EXPECT_EQ(s.output_type, CUDA_R_32F);
}

TEST(NsScalesTest, Fp16ScalesArePowersOfTwoAndOthersAreOne) {
  const NsScales bf16 = ScalesFor(CUDA_R_16BF, 4096, 14336);
  EXPECT_EQ(bf16.x, 1.0f);
  EXPECT_EQ(bf16.square, 1.0f);
  const NsScales fp16 = ScalesFor(CUDA_R_16F, 4096, 14336);
  for (const float s : {fp16.x, fp16.square, fp16.q}) {
    int exponent = 0;
    EXPECT_EQ(std::frexp(s, &exponent), 0.5f) << s;
  }
  // Largest normalized entry (1) and the largest polynomial value times the
  // scale stay finite in fp16 (65504).
  EXPECT_LE(fp16.x, 4096.0f);
  EXPECT_LE(fp16.square * 8.3f, 65504.0f);
  EXPECT_EQ(ScalesFor(CUDA_R_16F, 1, 1).x, 1.0f);
}

TEST(CudaKernelsCreateTest, NegativeDeviceIsRejectedBeforeTouchingCuda) {
  CudaKernelsOptions options;
  options.device = -1;
  const auto kernels = CudaKernels::Create(options);
  ASSERT_FALSE(kernels.ok());
  EXPECT_EQ(kernels.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(kernels.status().message()), HasSubstr("device"));
}

TEST(CudaKernelsCreateTest, FailsCleanlyWithoutAGpuAndWorksWithOne) {
  const auto kernels = CudaKernels::Create({});
  const auto staged = HostStagingKernels::Create({});
  if (GpuPresent()) {
    ASSERT_TRUE(kernels.ok()) << kernels.status();
    EXPECT_EQ((*kernels)->backend_name(), "cuda");
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
              cudaSuccess);
    EXPECT_TRUE((*kernels)->Synchronize(stream).ok());
    EXPECT_EQ((*kernels)->Synchronize(kHostStream).code(),
              absl::StatusCode::kInvalidArgument);
    cudaStreamDestroy(stream);
    EXPECT_TRUE(staged.ok()) << staged.status();
    return;
  }
  for (const absl::Status& status : {kernels.status(), staged.status()}) {
    ASSERT_FALSE(status.ok());
    EXPECT_THAT(status.code(), AnyOf(absl::StatusCode::kUnavailable,
                                     absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(std::string(status.message()), HasSubstr("device"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("GPU"));
  }
}

TEST(CudaKernelsCreateTest, AbsentDeviceIsAnErrorNotACrash) {
  CudaKernelsOptions options;
  options.device = 1000;
  const auto kernels = CudaKernels::Create(options);
  ASSERT_FALSE(kernels.ok());
  EXPECT_THAT(kernels.status().code(), AnyOf(absl::StatusCode::kInvalidArgument,
                                             absl::StatusCode::kUnavailable));
  EXPECT_THAT(std::string(kernels.status().message()), HasSubstr("device"));
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
