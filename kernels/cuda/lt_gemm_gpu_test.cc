// Runs LtGemm's searched cuBLASLt algorithms against cuBLAS and an fp64
// reference: LeftMultiply's strided products on row- and column-major
// stacks (the algorithm timed on fewer matrices than it then runs on), and
// LowerProduct's pointer-array tiles. Needs a GPU: tagged manual, run on
// the GPU machine by deploy/device.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/lt_gemm.h"
#include "kernels/cuda/symmetric_gemm.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

// bf16 bits of v (round to nearest even), and back.
uint16_t ToBf16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
float FromBf16(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// Deterministic values in [-1, 1), rounded to bf16.
std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed) {
  std::vector<uint16_t> out(n);
  for (uint16_t& v : out) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    v = ToBf16(static_cast<float>((seed >> 40) * 0x1.0p-23 - 1.0));
  }
  return out;
}

template <typename T>
DeviceBuffer Upload(const std::vector<T>& host) {
  auto buffer = DeviceBuffer::Allocate(host.size() * sizeof(T), "test data");
  EXPECT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(cudaMemcpy(buffer->get(), host.data(), host.size() * sizeof(T),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  return std::move(*buffer);
}

std::vector<float> Download(const DeviceBuffer& buffer) {
  std::vector<float> host(buffer.bytes() / sizeof(float));
  EXPECT_EQ(cudaMemcpy(host.data(), buffer.get(), buffer.bytes(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

double MaxRelative(const std::vector<float>& got,
                   const std::vector<double>& want) {
  double scale = 0, worst = 0;
  for (const double w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  return worst / scale;
}

class LtGemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              cudaSuccess)
        << "this test needs a CUDA GPU";
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasCreate(&baseline_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasLtCreate(&lt_), CUBLAS_STATUS_SUCCESS);
    auto ws = DeviceBuffer::Allocate(32 << 20, "cuBLASLt workspace");
    ASSERT_TRUE(ws.ok()) << ws.status();
    workspace_ = std::move(*ws);
    ASSERT_EQ(cublasSetStream(handle_, stream_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    cublasLtDestroy(lt_);
    cublasDestroy(baseline_);
    cublasDestroy(handle_);
    cudaStreamDestroy(stream_);
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  cublasHandle_t baseline_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  DeviceBuffer workspace_;
};

// y_i <- 0.5 q_i w_i + 0.25 y_i for row-major wide w (rows <= cols) or its
// column-major transpose (a tall row-major stack): cuBLAS and the searched
// cuBLASLt algorithm (timed on one matrix of three) both match fp64.
TEST_F(LtGemmTest, LeftMultiplyMatchesFp64OnCublasAndSearchedLt) {
  const int64_t count = 3, m = 128, n = 384;
  for (const bool row_major : {true, false}) {
    SCOPED_TRACE(row_major ? "row-major w" : "column-major w");
    // q symmetric, as LeftMultiply requires.
    std::vector<uint16_t> q = RandomBf16(count * m * m, 1);
    for (int64_t b = 0; b < count; ++b) {
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < r; ++c) {
          q[b * m * m + c * m + r] = q[b * m * m + r * m + c];
        }
      }
    }
    const std::vector<uint16_t> w = RandomBf16(count * m * n, 2);
    std::vector<float> y0(count * m * n);
    for (size_t i = 0; i < y0.size(); ++i) y0[i] = FromBf16(q[i % q.size()]);
    DeviceBuffer dq = Upload(q), dw = Upload(w);
    const StackOperand wide{dw.get(), m * n, row_major ? n : m, row_major};
    // Element (r, c) of matrix b of w, in the operand's layout.
    const auto at = [&](int64_t b, int64_t r, int64_t c) {
      return b * m * n + (row_major ? r * n + c : c * m + r);
    };
    std::vector<double> want(y0.size());
    for (int64_t b = 0; b < count; ++b) {
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          double sum = 0;
          for (int64_t k = 0; k < m; ++k) {
            sum += static_cast<double>(FromBf16(q[b * m * m + r * m + k])) *
                   FromBf16(w[at(b, k, c)]);
          }
          want[at(b, r, c)] = 0.5 * sum + 0.25 * y0[at(b, r, c)];
        }
      }
    }
    const LtGemm::Shape shape =
        LeftMultiplyShape(CUDA_R_16BF, CUDA_R_32F, count, m, n, wide);
    DeviceBuffer scratch = Upload(y0);
    absl::StatusOr<std::unique_ptr<LtGemm>> lt = LtGemm::Search(
        lt_, baseline_, shape, LeftMultiplyA(dq.get(), wide),
        LeftMultiplyB(dq.get(), wide), scratch.get(), workspace_.get(),
        workspace_.bytes(), 24, /*timed_batch=*/1);
    ASSERT_TRUE(lt.ok()) << lt.status();
    EXPECT_FALSE((*lt)->trials().empty());
    EXPECT_GT((*lt)->baseline_ms(), 0.0);
    const LtGemm* const runs[2] = {nullptr, lt->get()};
    for (const LtGemm* run : runs) {
      DeviceBuffer y = Upload(y0);
      const absl::Status status =
          LeftMultiply(handle_, CUDA_R_16BF, CUDA_R_32F, count, m, n, 0.5f,
                       dq.get(), wide, 0.25f, y.get(), run);
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      EXPECT_LT(MaxRelative(Download(y), want), 1e-5)
          << (run == nullptr ? "cuBLAS" : "cuBLASLt");
    }
  }
}

// The lower-triangle tiles of X X^T (4 x 4 blocks of 64 rows, 3 matrices):
// the searched cuBLASLt algorithm writes what cuBLAS writes, within fp32
// summation order.
TEST_F(LtGemmTest, TileProductsAgreeWithCublas) {
  const int64_t count = 3, m = 256, k = 512;
  const int blocks = 4;
  const std::vector<uint16_t> x = RandomBf16(count * m * k, 3);
  DeviceBuffer dx = Upload(x);
  const StackOperand op{dx.get(), m * k, k, true};
  std::vector<std::vector<float>> results;
  for (const bool use_lt : {false, true}) {
    auto c = DeviceBuffer::Allocate(count * m * m * sizeof(float), "c");
    ASSERT_TRUE(c.ok()) << c.status();
    auto tiles =
        TilePointers::Build(op, op, c->as<float>(), 2, count, m, blocks);
    ASSERT_TRUE(tiles.ok()) << tiles.status();
    const LtGemm::Shape shape =
        TileShape(CUDA_R_16BF, m, m / blocks, k, op, op, tiles->tiles());
    std::unique_ptr<LtGemm> lt;
    if (use_lt) {
      auto found =
          LtGemm::Search(lt_, baseline_, shape, tiles->a(), tiles->b(),
                         tiles->c(), workspace_.get(), workspace_.bytes());
      ASSERT_TRUE(found.ok()) << found.status();
      lt = std::move(*found);
      ASSERT_EQ(cudaMemset(c->get(), 0, c->bytes()), cudaSuccess);
      ASSERT_TRUE(
          lt->Run(1.0f, tiles->a(), tiles->b(), 0.0f, tiles->c(), stream_)
              .ok());
    } else {
      ASSERT_TRUE(CublasGemm(handle_, shape, 1.0f, tiles->a(), tiles->b(), 0.0f,
                             tiles->c())
                      .ok());
    }
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    results.push_back(Download(*c));
  }
  double scale = 0, worst = 0;
  int64_t checked = 0;
  for (int64_t b = 0; b < count; ++b) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j <= i; ++j, ++checked) {
        const int64_t at = b * m * m + i * m + j;
        scale = std::max(scale, std::fabs(double{results[0][at]}));
        worst =
            std::max(worst, std::fabs(double{results[0][at]} - results[1][at]));
      }
    }
  }
  EXPECT_EQ(checked, count * m * (m + 1) / 2);
  EXPECT_GT(scale, 1.0);
  EXPECT_LT(worst / scale, 1e-5);
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
