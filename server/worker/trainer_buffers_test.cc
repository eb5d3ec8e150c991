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

// A host trainer's gradients live in its segment: a step that places one
// elsewhere is refused naming the field, and one that places none maps none.
TEST(TrainerBuffersTest, HostMemoryTakesNoGradientPlaces) {
  class HostBuffers final : public TrainerBuffers {
   public:
    Device device() const override { return kHostDevice; }
    absl::StatusOr<LentTensor> Map(const TensorBinding&, int64_t,
                                   int64_t) override {
      return LentTensor{};
    }
  } buffers;
  EXPECT_TRUE(buffers.MapPlaces({}, {})->empty());
  GradientPlace place;
  place.buffer.ipc_handle = std::string(64, 'x');
  const absl::StatusOr<std::vector<void*>> placed =
      buffers.MapPlaces({place}, {64});
  ASSERT_FALSE(placed.ok());
  EXPECT_EQ(placed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(placed.status().message().find("gradients[0]"), std::string::npos)
      << placed.status();
}

}  // namespace
}  // namespace worker
}  // namespace muonps
