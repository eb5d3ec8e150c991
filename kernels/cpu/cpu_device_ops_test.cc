#include "kernels/cpu/cpu_device_ops.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace muonps {
namespace kernels {
namespace {

TEST(CpuDeviceOpsTest, AllocatesZeroedBuffersAndRefusesNegativeSizes) {
  CpuDeviceOps ops;
  absl::StatusOr<std::unique_ptr<FloatBuffer>> b = ops.Allocate(5, "scratch");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->size(), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ((*b)->data()[i], 0.0f);
  EXPECT_EQ(ops.Allocate(-1, "scratch").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuDeviceOpsTest, ScaleCopyAndApplyUseTheStepsFp32Arithmetic) {
  CpuDeviceOps ops;
  std::vector<float> a = {1.5f, -2.0f, 3.25f}, b(3);
  ASSERT_TRUE(ops.Copy(b.data(), a.data(), 3, kHostStream).ok());
  EXPECT_EQ(a, b);
  ASSERT_TRUE(ops.Scale(b.data(), 3, 0.5f, kHostStream).ok());
  EXPECT_EQ(b, (std::vector<float>{0.75f, -1.0f, 1.625f}));
  std::vector<float> p = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(ops.ApplyScaled(p.data(), DType::kFloat32, a.data(),
                              DType::kFloat32, 3, 0.9f, -0.1f, kHostStream)
                  .ok());
  for (int i = 0; i < 3; ++i) {
    const float want = (i + 1.0f) * 0.9f + -0.1f * a[i];
    EXPECT_EQ(p[i], want);
  }
}

TEST(CpuDeviceOpsTest, Bf16TensorsConvertExactlyAndRoundTheUpdateOnce) {
  CpuDeviceOps ops;
  const std::vector<float> values = {1.0f, -0.3f, 1e-3f, 3.0e4f};
  std::vector<uint16_t> lent(values.size());
  ASSERT_TRUE(ops.FromFloat(lent.data(), DType::kBFloat16, values.data(), 4,
                            kHostStream)
                  .ok());
  std::vector<float> widened(values.size());
  ASSERT_TRUE(
      ops.ToFloat(widened.data(), lent.data(), DType::kBFloat16, 4, kHostStream)
          .ok());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(lent[i], FloatToBFloat16(values[i]));
    EXPECT_EQ(widened[i], BFloat16ToFloat(lent[i]));
  }
  const std::vector<float> update = {0.5f, 0.25f, -1.0f, 2.0f};
  ASSERT_TRUE(ops.ApplyScaled(lent.data(), DType::kBFloat16, update.data(),
                              DType::kFloat32, 4, 0.99f, -0.01f, kHostStream)
                  .ok());
  for (size_t i = 0; i < values.size(); ++i) {
    const float want = widened[i] * 0.99f + -0.01f * update[i];
    EXPECT_EQ(lent[i], FloatToBFloat16(want)) << i;
  }
}

// A Muon update in the precision Newton-Schulz ran in: applying it equals
// applying its widened fp32 values, for either parameter dtype.
TEST(CpuDeviceOpsTest, A16BitUpdateAppliesAsItsWidenedValues) {
  CpuDeviceOps ops;
  const std::vector<float> update = {0.5f, -0.3f, 1e-3f, 2.7e-2f, -7.1e-5f};
  const int64_t n = static_cast<int64_t>(update.size());
  for (const DType update_dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> narrow(n);
    ASSERT_TRUE(ops.FromFloat(narrow.data(), update_dtype, update.data(), n,
                              kHostStream)
                    .ok());
    std::vector<float> widened(n);
    ASSERT_TRUE(
        ops.ToFloat(widened.data(), narrow.data(), update_dtype, n, kHostStream)
            .ok());
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = update_dtype == DType::kBFloat16
                                ? FloatToBFloat16(update[i])
                                : FloatToHalf(update[i]);
      EXPECT_EQ(narrow[i], want) << DTypeName(update_dtype) << " " << i;
    }
    for (const DType param_dtype : {DType::kFloat32, DType::kBFloat16}) {
      const std::vector<float> start = {1.0f, -2.0f, 0.25f, 3.0f, -0.5f};
      std::vector<char> got(n * DTypeSize(param_dtype));
      std::vector<char> want(got.size());
      ASSERT_TRUE(
          ops.FromFloat(got.data(), param_dtype, start.data(), n, kHostStream)
              .ok());
      want = got;
      ASSERT_TRUE(ops.ApplyScaled(got.data(), param_dtype, narrow.data(),
                                  update_dtype, n, 0.99f, -0.01f, kHostStream)
                      .ok());
      ASSERT_TRUE(ops.ApplyScaled(want.data(), param_dtype, widened.data(),
                                  DType::kFloat32, n, 0.99f, -0.01f,
                                  kHostStream)
                      .ok());
      EXPECT_EQ(got, want) << DTypeName(update_dtype) << " onto "
                           << DTypeName(param_dtype);
    }
  }
}

TEST(CpuDeviceOpsTest, RefusesFp16ParametersNamingTheDtype) {
  CpuDeviceOps ops;
  uint16_t half = 0;
  const float update = 1;
  const absl::Status s = ops.ApplyScaled(
      &half, DType::kFloat16, &update, DType::kFloat32, 1, 1, -1, kHostStream);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dtype: fp16"), absl::string_view::npos);
}

TEST(CpuDeviceOpsTest, FiniteChecksFindEachSpansFirstBadElement) {
  CpuDeviceOps ops;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> good = {1, 2, 3}, bad = {1, NAN, inf};
  ASSERT_TRUE(ops.PrepareFiniteChecks(5, kHostStream).ok());
  // Checked in two calls, out of order; span 3 is never checked.
  ASSERT_TRUE(
      ops.CheckFinite({{bad.data() + 2, 1}, {good.data(), 3}}, 2, kHostStream)
          .ok());
  ASSERT_TRUE(
      ops.CheckFinite({{good.data(), 3}, {bad.data(), 3}}, 0, kHostStream)
          .ok());
  absl::StatusOr<std::vector<int64_t>> found =
      ops.FiniteResults(5, kHostStream);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, (std::vector<int64_t>{-1, 1, 0, -1, -1}));
  EXPECT_EQ(ops.CheckFinite({{good.data(), 3}}, 5, kHostStream).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(ops.FiniteResults(6, kHostStream).status().code(),
            absl::StatusCode::kOutOfRange);
}

TEST(CpuDeviceOpsTest, RefusesADeviceStream) {
  CpuDeviceOps ops;
  float x = 1;
  Stream device_stream = reinterpret_cast<Stream>(0x10);
  EXPECT_EQ(ops.Scale(&x, 1, 2.0f, device_stream).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kernels
}  // namespace muonps
