#include "server/worker/trainer_buffers.h"

#include "gtest/gtest.h"

namespace muonps {
namespace worker {
namespace {

v1::TensorBinding Binding(v1::DType dtype) {
  v1::TensorBinding b;
  b.set_name("layers.0.w");
  b.set_dtype(dtype);
  return b;
}

TEST(LentDTypeTest, Fp32ByDefaultAndBf16) {
  EXPECT_EQ(*LentDType(Binding(v1::DTYPE_UNSPECIFIED)), DType::kFloat32);
  EXPECT_EQ(*LentDType(Binding(v1::DTYPE_FP32)), DType::kFloat32);
  EXPECT_EQ(*LentDType(Binding(v1::DTYPE_BF16)), DType::kBFloat16);
}

TEST(LentDTypeTest, OtherTypesAreRefusedNamingTheTensorAndDtype) {
  for (const v1::DType dtype : {v1::DTYPE_FP16, static_cast<v1::DType>(99)}) {
    const absl::StatusOr<DType> lent = LentDType(Binding(dtype));
    ASSERT_FALSE(lent.ok());
    EXPECT_EQ(lent.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(lent.status().message());
    EXPECT_NE(message.find("tensor \"layers.0.w\""), std::string::npos)
        << message;
    EXPECT_NE(message.find("dtype"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace worker
}  // namespace muonps
