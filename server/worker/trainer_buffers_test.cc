#include "server/worker/trainer_buffers.h"

#include "gtest/gtest.h"

namespace muonps {
namespace worker {
namespace {

TensorBinding Binding(DType dtype) {
  TensorBinding b;
  b.name = "layers.0.w";
  b.dtype = dtype;
  return b;
}

TEST(LentDTypeTest, Fp32AndBf16AreLent) {
  EXPECT_EQ(*LentDType(Binding(DType::kFloat32)), DType::kFloat32);
  EXPECT_EQ(*LentDType(Binding(DType::kBFloat16)), DType::kBFloat16);
}

TEST(LentDTypeTest, OtherTypesAreRefusedNamingTheTensorAndDtype) {
  const absl::StatusOr<DType> lent = LentDType(Binding(DType::kFloat16));
  ASSERT_FALSE(lent.ok());
  EXPECT_EQ(lent.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(lent.status().message());
  EXPECT_NE(message.find("tensor \"layers.0.w\""), std::string::npos)
      << message;
  EXPECT_NE(message.find("dtype"), std::string::npos) << message;
}

}  // namespace
}  // namespace worker
}  // namespace muonps
