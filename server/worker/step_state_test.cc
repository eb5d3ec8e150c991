#include "server/worker/step_state.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"

namespace muonps {
namespace worker {
namespace {

// Maps a place to the address its handle's first byte names, as offsets
// into `memory`, and records each call's byte counts; a handle starting
// with 'x' cannot be mapped.
class PlacingBuffers final : public TrainerBuffers {
 public:
  explicit PlacingBuffers(char* memory) : memory_(memory) {}
  Device device() const override { return {MemoryKind::kCuda, 0}; }
  absl::StatusOr<LentTensor> Map(const TensorBinding&, int64_t,
                                 int64_t) override {
    return LentTensor{};
  }
  absl::StatusOr<std::vector<void*>> MapPlaces(
      const std::vector<GradientPlace>& places,
      const std::vector<int64_t>& bytes) override {
    std::vector<void*> out;
    for (size_t i = 0; i < places.size(); ++i) {
      if (places[i].buffer.ipc_handle[0] == 'x') {
        return InvalidField("gradients[" + std::to_string(i) + "].buffer",
                            "cannot be mapped");
      }
      out.push_back(memory_ + places[i].buffer.offset);
    }
    calls.push_back(bytes);
    return out;
  }
  std::vector<std::vector<int64_t>> calls;

 private:
  char* memory_;
};

GradientPlace At(int position, int64_t offset, char handle = 'a') {
  GradientPlace place;
  place.matrix = position;
  place.buffer.ipc_handle = std::string(64, handle);
  place.buffer.offset = offset;
  return place;
}

class PlaceGradientsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto buffers = std::make_unique<PlacingBuffers>(elsewhere_);
    placing_ = buffers.get();
    trainer_.buffers = std::move(buffers);
    // Job matrices 0 (fp32, 4 values), 1 (bf16, 8 values) and 2 (fp32, 2
    // values), bound in the order 2, 0, 1.
    trainer_.matrices.resize(3);
    const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat32};
    const int64_t elements[] = {4, 8, 2};
    for (int m = 0; m < 3; ++m) {
      LentTensor lent;
      lent.grad = &home_[m * 16];
      lent.dtype = dtypes[m];
      trainer_.matrices[m].Lend(lent);
      trainer_.matrices[m].elements = elements[m];
    }
    widened_ = reinterpret_cast<float*>(&home_[48]);
    trainer_.matrices[1].grad = widened_;
    trainer_.bound_position = {1, 2, 0};
  }

  char home_[64] = {};
  char elsewhere_[64] = {};
  float* widened_ = nullptr;
  PlacingBuffers* placing_ = nullptr;
  AttachedTrainer trainer_;
};

TEST_F(PlaceGradientsTest, PlacedGradientsAreReadWhereTheyLieAndTheRestAtHome) {
  // Positions: 0 is job matrix 2, 2 is job matrix 1.
  ASSERT_TRUE(trainer_.PlaceGradients({At(0, 8), At(2, 32)}).ok());
  ASSERT_EQ(placing_->calls.size(), 1u);
  EXPECT_EQ(placing_->calls[0], (std::vector<int64_t>{8, 16}));
  const std::vector<Binding>& m = trainer_.matrices;
  EXPECT_EQ(m[2].lent_grad, &elsewhere_[8]);
  EXPECT_EQ(static_cast<void*>(m[2].grad), &elsewhere_[8]);
  // A bf16 gradient is read from where it lies into its widened copy.
  EXPECT_EQ(m[1].lent_grad, &elsewhere_[32]);
  EXPECT_EQ(m[1].grad, widened_);
  EXPECT_EQ(m[0].lent_grad, &home_[0]);
  // The next step places none: every gradient is read at home again.
  ASSERT_TRUE(trainer_.PlaceGradients({}).ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(m[i].lent_grad, &home_[i * 16]);
  EXPECT_EQ(static_cast<void*>(m[2].grad), &home_[32]);
  EXPECT_EQ(m[1].grad, widened_);
}

TEST_F(PlaceGradientsTest, BadPlacesAreRefusedNamingThemAndChangeNothing) {
  ASSERT_TRUE(trainer_.PlaceGradients({At(1, 0)}).ok());
  for (const std::vector<GradientPlace>& places :
       {std::vector<GradientPlace>{At(3, 0)},
        {At(-1, 0)},
        {At(0, 0), At(0, 8)},
        {At(2, 0), At(0, 8, 'x')}}) {
    const absl::Status status = trainer_.PlaceGradients(places);
    ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    const std::string message(status.message());
    EXPECT_NE(message.find("gradients["), std::string::npos) << message;
    // Still as the last step that was placed.
    EXPECT_EQ(trainer_.matrices[0].lent_grad, &elsewhere_[0]);
    EXPECT_EQ(trainer_.matrices[2].lent_grad, &home_[32]);
  }
}

// A matrix that lends no gradient buffer is read only where each step
// places its gradient: a step that places none is refused naming it.
TEST_F(PlaceGradientsTest, AMatrixLendingNoGradientMustBePlacedEveryStep) {
  trainer_.matrices[2].home_grad = nullptr;  // bound at position 0
  const absl::Status status = trainer_.PlaceGradients({At(1, 0)});
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("position 0 lends no gradient buffer"),
            std::string::npos)
      << status;
  EXPECT_TRUE(placing_->calls.empty());  // nothing mapped
  ASSERT_TRUE(trainer_.PlaceGradients({At(0, 8)}).ok());
  EXPECT_EQ(trainer_.matrices[2].lent_grad, &elsewhere_[8]);
}

}  // namespace
}  // namespace worker
}  // namespace muonps
