// The Hopper symmetric-product kernel (wgmma_lower.h) against cuBLAS: for
// bf16 and fp16 operands, shapes on and off its 128-row tiles, alpha/beta
// and every fused combine output, LowerProductCombine with SymmetricMode::
// kWgmma matches the dense cuBLAS product followed by the combine pass
// within fp32 summation order (16-bit outputs within one rounding), its
// 16-bit outputs are exactly symmetric, and it counts the same unhealthy
// diagonal entries. Needs an sm_90 GPU: tagged manual, run on the GPU
// machine by deploy/device; skipped on other GPUs.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ns_elementwise.h"
#include "kernels/cuda/symmetric_gemm.h"
#include "kernels/cuda/wgmma_lower.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

struct Case {
  int64_t count, m, k;
  bool same;  // R = L (X X^T), else R = -L or independent
  bool negate;
  float alpha, beta;
  bool other;
};

std::string Name(const Case& c, cudaDataType type) {
  return absl::StrCat(type == CUDA_R_16BF ? "bf16 " : "fp16 ", c.count, "x",
                      c.m, "x", c.k, c.same ? " same" : "",
                      c.negate ? " negated" : "", " alpha ", c.alpha, " beta ",
                      c.beta, c.other ? " other" : "");
}

float LowToFloat(const uint16_t bits, cudaDataType type) {
  if (type == CUDA_R_16BF) {
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &wide, sizeof(f));
    return f;
  }
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// Everything one run writes, downloaded.
struct Outputs {
  std::vector<float> product32, value32;
  std::vector<uint16_t> value_low, with_diag_low;
  unsigned int unhealthy = 0;
};

class WgmmaLowerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              cudaSuccess)
        << "this test needs a CUDA GPU";
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(cublasSetStream(handle_, stream_), CUBLAS_STATUS_SUCCESS);
    if (!WgmmaLowerSupported(0, CUDA_R_16BF, 128, 64)) {
      GTEST_SKIP() << "not an sm_90 GPU";
    }
  }
  void TearDown() override {
    cublasDestroy(handle_);
    cudaStreamDestroy(stream_);
  }

  DeviceBuffer Upload(const std::vector<float>& host) {
    auto b = DeviceBuffer::Allocate(host.size() * sizeof(float), "test data");
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(cudaMemcpy(b->get(), host.data(), host.size() * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    return std::move(*b);
  }
  DeviceBuffer Zeros(size_t bytes) {
    auto b = DeviceBuffer::Allocate(bytes, "test output");
    EXPECT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(cudaMemset(b->get(), 0, bytes), cudaSuccess);
    return std::move(*b);
  }
  template <typename T>
  std::vector<T> Download(const DeviceBuffer& b, size_t n) {
    std::vector<T> host(n);
    EXPECT_EQ(
        cudaMemcpy(host.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost),
        cudaSuccess);
    return host;
  }

  // One LowerProductCombine of case `c` under `plan`, from fixed inputs.
  // Without `sixteen_bit`, only the fp32 outputs are asked for (the kernel
  // then runs without its staging buffer).
  Outputs Run(const Case& c, cudaDataType type, const SymmetricPlan& plan,
              bool sixteen_bit = true) {
    std::mt19937 rng(static_cast<uint32_t>(c.m * 31 + c.k));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const size_t wide = static_cast<size_t>(c.count * c.m * c.k);
    const size_t square = static_cast<size_t>(c.count * c.m * c.m);
    std::vector<float> l(wide), r(wide), c0(square), other(square);
    for (float& x : l) x = u(rng);
    for (size_t i = 0; i < wide; ++i) {
      r[i] = c.same ? l[i] : (c.negate ? -l[i] : u(rng));
    }
    for (float& x : c0) x = u(rng);
    for (float& x : other) x = u(rng);
    DeviceBuffer l32 = Upload(l), r32 = Upload(r), c32 = Upload(c0),
                 other32 = Upload(other);
    DeviceBuffer l_low = Zeros(wide * 2), r_low = Zeros(wide * 2);
    EXPECT_EQ(
        LaunchCast(l32.as<float>(), wide, l_low.get(), type, 1.0f, stream_),
        cudaSuccess);
    EXPECT_EQ(
        LaunchCast(r32.as<float>(), wide, r_low.get(), type, 1.0f, stream_),
        cudaSuccess);
    DeviceBuffer value32 = Zeros(square * 4), value_low = Zeros(square * 2),
                 with_diag = Zeros(square * 2), bad = Zeros(sizeof(unsigned));
    const StackOperand lo{l_low.get(), c.m * c.k, c.k, true};
    const StackOperand ro{c.same ? l_low.get() : r_low.get(), c.m * c.k, c.k,
                          true};
    TilePointers tiles;
    if (plan.mode == SymmetricMode::kWgmma) {
      const absl::Status s = tiles.AddWgmma(lo, ro, type, c.count, c.m, c.k);
      EXPECT_TRUE(s.ok()) << s;
      EXPECT_TRUE(tiles.has_wgmma());
    }
    ProductCombine combine;
    if (c.other) {
      combine.other = other32.as<float>();
      combine.coef_other = 0.75f;
      combine.coef_product = -1.5f;
    }
    combine.value32 = value32.as<float>();
    if (sixteen_bit) {
      combine.value_low = value_low.get();
      combine.value_scale = 2.0f;
      combine.with_diag_low = with_diag.get();
      combine.diag = 0.5f;
      combine.with_diag_scale = 4.0f;
    }
    if (!c.other) combine.unhealthy = bad.as<unsigned int>();
    const absl::Status s = LowerProductCombine(
        handle_, plan, type, c.count, c.m, c.k, c.alpha, lo, ro, c.beta,
        c32.as<float>(), plan.mode == SymmetricMode::kWgmma ? &tiles : nullptr,
        combine);
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    Outputs out;
    out.product32 = Download<float>(c32, square);
    out.value32 = Download<float>(value32, square);
    out.value_low = Download<uint16_t>(value_low, square);
    out.with_diag_low = Download<uint16_t>(with_diag, square);
    out.unhealthy = Download<unsigned int>(bad, 1)[0];
    return out;
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
};

// Largest |got - want| over the lower triangles, relative to max |want|.
double LowerError(const std::vector<float>& got, const std::vector<float>& want,
                  int64_t count, int64_t m) {
  double err = 0, scale = 0;
  for (int64_t b = 0; b < count; ++b) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j <= i; ++j) {
        const size_t at = static_cast<size_t>((b * m + i) * m + j);
        err = std::max(err, std::fabs(static_cast<double>(got[at]) - want[at]));
        scale = std::max(scale, std::fabs(static_cast<double>(want[at])));
      }
    }
  }
  return scale > 0 ? err / scale : err;
}

TEST_F(WgmmaLowerTest, MatchesCublasAndTheCombinePass) {
  const SymmetricPlan dense{SymmetricMode::kDense, 1, 1};
  const SymmetricPlan wgmma{SymmetricMode::kWgmma, 16, 256};
  const Case cases[] = {
      {2, 128, 64, true, false, 1.0f, 0.0f, false},
      {3, 256, 200, false, false, 0.5f, 0.0f, true},
      {2, 392, 1000, true, false, 0.25f, 1.5f, false},
      {2, 520, 256, false, true, 1.0f, 0.0f, false},
      {4, 1024, 4096, true, false, 1.0f / 64, 0.0f, false},
      {2, 1024, 1024, false, false, 1.0f / 32, -0.75f, true},
      // Several tiles per block: both warp groups, in turns.
      {16, 1024, 256, false, false, 1.0f, 0.5f, true},
      {9, 1536, 512, true, false, 0.125f, 0.0f, false},
  };
  for (const cudaDataType type : {CUDA_R_16BF, CUDA_R_16F}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(Name(c, type));
      const Outputs want = Run(c, type, dense);
      const Outputs got = Run(c, type, wgmma);
      EXPECT_LT(LowerError(got.product32, want.product32, c.count, c.m), 1e-5);
      EXPECT_LT(LowerError(got.value32, want.value32, c.count, c.m), 1e-5);
      // 16-bit outputs: within one rounding of the reference, and the upper
      // triangle a bit-exact copy of the lower.
      const double u =
          type == CUDA_R_16BF ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      for (const auto& [g, w, scale] :
           {std::make_tuple(&got.value_low, &want.value_low, 2.0),
            std::make_tuple(&got.with_diag_low, &want.with_diag_low, 4.0)}) {
        double err = 0, big = 0;
        int64_t asymmetric = 0;
        for (int64_t b = 0; b < c.count; ++b) {
          for (int64_t i = 0; i < c.m; ++i) {
            for (int64_t j = 0; j < c.m; ++j) {
              const size_t at = static_cast<size_t>((b * c.m + i) * c.m + j);
              const size_t mirror =
                  static_cast<size_t>((b * c.m + j) * c.m + i);
              const double gv = LowToFloat((*g)[at], type);
              const double wv = LowToFloat((*w)[at], type);
              err = std::max(err, std::fabs(gv - wv) / scale);
              big = std::max(big, std::fabs(wv) / scale);
              if ((*g)[at] != (*g)[mirror]) ++asymmetric;
            }
          }
        }
        EXPECT_LE(err, 2 * u * big + 1e-6);
        EXPECT_EQ(asymmetric, 0);
      }
      EXPECT_EQ(got.unhealthy, want.unhealthy);
      const Outputs fp32_only = Run(c, type, wgmma, /*sixteen_bit=*/false);
      EXPECT_LT(LowerError(fp32_only.product32, want.product32, c.count, c.m),
                1e-5);
      EXPECT_LT(LowerError(fp32_only.value32, want.value32, c.count, c.m),
                1e-5);
      EXPECT_EQ(fp32_only.unhealthy, want.unhealthy);
      if (c.negate) {
        EXPECT_EQ(got.unhealthy, c.count * c.m);
      }
    }
  }
}

TEST_F(WgmmaLowerTest, RefusesOperandsItCannotAddress) {
  CUtensorMap map;
  // A leading dimension that is not a multiple of 8 elements.
  EXPECT_NE(EncodeWgmmaOperand(reinterpret_cast<void*>(256), CUDA_R_16BF, 1,
                               128, 64, 68, 128 * 68, &map),
            cudaSuccess);
  EXPECT_NE(EncodeWgmmaOperand(reinterpret_cast<void*>(256), CUDA_R_32F, 1, 128,
                               64, 64, 128 * 64, &map),
            cudaSuccess);
  EXPECT_FALSE(WgmmaLowerSupported(0, CUDA_R_16BF, 64, 64));
  EXPECT_FALSE(WgmmaLowerSupported(0, CUDA_R_32F, 1024, 1024));
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
