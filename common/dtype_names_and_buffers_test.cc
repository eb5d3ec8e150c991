// DType's sizes and names, ParseDType's accepted and refused names, and
// the buffer conversions ToFloat and FromFloat for every dtype (empty
// buffers may be null).
#include <cmath>
#include <cstdint>

#include "common/dtype.h"
#include "common/float_bits_test_util.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

using dtype_test::Bits;

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2u);
  EXPECT_EQ(DTypeName(DType::kFloat32), "fp32");
  EXPECT_EQ(DTypeName(DType::kBFloat16), "bf16");
  EXPECT_EQ(DTypeName(DType::kFloat16), "fp16");
}

TEST(DTypeTest, ParseAcceptsShortAndLongNames) {
  const struct {
    const char* name;
    DType dtype;
  } cases[] = {
      {"fp32", DType::kFloat32},  {"float32", DType::kFloat32},
      {"bf16", DType::kBFloat16}, {"bfloat16", DType::kBFloat16},
      {"fp16", DType::kFloat16},  {"float16", DType::kFloat16},
  };
  for (const auto& c : cases) {
    const absl::StatusOr<DType> parsed = ParseDType(c.name);
    ASSERT_TRUE(parsed.ok()) << c.name << ": " << parsed.status();
    EXPECT_EQ(*parsed, c.dtype) << c.name;
  }
  for (const DType dtype :
       {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const absl::StatusOr<DType> parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
}

TEST(DTypeTest, ParseRejectsOtherNamesWithInvalidArgumentNamingDtype) {
  for (const char* name :
       {"", "FP32", "fp64", "int8", "half", "bf16 ", " fp16", "float"}) {
    const absl::StatusOr<DType> parsed = ParseDType(name);
    ASSERT_FALSE(parsed.ok()) << "\"" << name << "\" was accepted";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("dtype"), absl::string_view::npos)
        << parsed.status();
  }
}

TEST(DTypeTest, Float32BufferConvertsUnchanged) {
  const float src[] = {1.0f, -2.5f, 0.1f, 3.0e38f, -0.0f};
  float dst[6] = {0, 0, 0, 0, 0, 42.0f};
  FromFloat(DType::kFloat32, src, 5, dst);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Bits(dst[i]), Bits(src[i])) << i;
  EXPECT_EQ(dst[5], 42.0f) << "wrote past count";
  float back[6] = {0, 0, 0, 0, 0, 42.0f};
  ToFloat(DType::kFloat32, dst, 5, back);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Bits(back[i]), Bits(src[i])) << i;
  EXPECT_EQ(back[5], 42.0f) << "wrote past count";
}

TEST(DTypeTest, BFloat16BufferConvertsElementwise) {
  const float src[] = {1.0f, -2.5f, 0.1f, 3.0e38f, -0.0f};
  const uint16_t expected[] = {0x3f80u, 0xc020u, 0x3dcdu, 0x7f62u, 0x8000u};
  uint16_t dst[6] = {0, 0, 0, 0, 0, 0xabcdu};
  FromFloat(DType::kBFloat16, src, 5, dst);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dst[i], expected[i]) << i;
  EXPECT_EQ(dst[5], 0xabcdu) << "wrote past count";
  float back[6] = {0, 0, 0, 0, 0, 42.0f};
  ToFloat(DType::kBFloat16, dst, 5, back);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(Bits(back[i]), static_cast<uint32_t>(expected[i]) << 16) << i;
  }
  EXPECT_EQ(back[5], 42.0f) << "wrote past count";
}

TEST(DTypeTest, Float16BufferConvertsElementwise) {
  const float src[] = {1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24), -0.0f};
  const uint16_t expected[] = {0x3c00u, 0xc100u, 0x7bffu, 0x0001u, 0x8000u};
  uint16_t dst[6] = {0, 0, 0, 0, 0, 0xabcdu};
  FromFloat(DType::kFloat16, src, 5, dst);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(dst[i], expected[i]) << i;
  EXPECT_EQ(dst[5], 0xabcdu) << "wrote past count";
  float back[6] = {0, 0, 0, 0, 0, 42.0f};
  ToFloat(DType::kFloat16, dst, 5, back);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Bits(back[i]), Bits(src[i])) << i;
  EXPECT_EQ(back[5], 42.0f) << "wrote past count";
}

// Conversions must not hand memcpy null pointers for empty buffers (UBSan:
// "null pointer passed as argument 1", even for 0 bytes): TensorView accepts
// null data for empty tensors, so an empty view reaches here with nulls.
TEST(DTypeTest, EmptyBuffersMayBeNull) {
  for (const DType dtype :
       {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    ToFloat(dtype, nullptr, 0, nullptr);
    FromFloat(dtype, nullptr, 0, nullptr);
  }
}

}  // namespace
}  // namespace muonps
