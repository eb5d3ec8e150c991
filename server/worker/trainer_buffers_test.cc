#include "server/worker/trainer_buffers.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "lending/shared_memory.h"
#include "lending/undo_area.h"

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

// A trainer's segment of `bytes` bytes, as the client lends it: its step
// record at 64 bytes, an undo area for two matrices from 256 bytes on.
class SharedMemoryUndoAreaTest : public ::testing::Test {
 protected:
  static constexpr int64_t kBytes = 8192;

  void SetUp() override {
    // The pid and a random token: concurrent runs share /dev/shm.
    absl::StatusOr<SharedMemorySegment> segment = SharedMemorySegment::Create(
        absl::StrCat("/muonps-test-", getpid(), "-", std::random_device()(),
                     "-undo"),
        kBytes);
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_.emplace(*std::move(segment));
    request_.segment = segment_->name();
    request_.segment_bytes = kBytes;
    request_.step_record_offset = 64;
    request_.undo_offset = 256;
    request_.undo_bytes = UndoAreaLayout({24 * 40, 10 * 12}).bytes;
  }

  void ExpectRefusedNaming(const std::string& field) {
    const absl::StatusOr<std::unique_ptr<TrainerBuffers>> buffers =
        OpenSharedMemoryBuffers(request_);
    ASSERT_FALSE(buffers.ok());
    EXPECT_EQ(buffers.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(buffers.status().message().find(field + ":"), std::string::npos)
        << buffers.status();
  }

  std::optional<SharedMemorySegment> segment_;
  AttachRequest request_;
};

TEST_F(SharedMemoryUndoAreaTest, TheAreaMapsToItsBytesOfTheSegment) {
  ASSERT_EQ(request_.undo_bytes, 3840 + 512);
  const absl::StatusOr<std::unique_ptr<TrainerBuffers>> buffers =
      OpenSharedMemoryBuffers(request_);
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  EXPECT_EQ((*buffers)->undo_area_bytes(), request_.undo_bytes);
  ASSERT_NE((*buffers)->undo_area(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>((*buffers)->undo_area()) % 256, 0u);
  // The same pages as the trainer's: what the worker writes there, the
  // trainer's segment holds (and a successor reads back).
  const float value = 1.25f;
  std::memcpy(static_cast<char*>((*buffers)->undo_area()) + 4096, &value, 4);
  float seen = 0;
  std::memcpy(&seen, static_cast<const char*>(segment_->data()) + 256 + 4096,
              4);
  EXPECT_EQ(seen, value);
}

TEST_F(SharedMemoryUndoAreaTest, NoneLentMapsNothing) {
  request_.undo_offset = -1;
  request_.undo_bytes = 0;
  const absl::StatusOr<std::unique_ptr<TrainerBuffers>> buffers =
      OpenSharedMemoryBuffers(request_);
  ASSERT_TRUE(buffers.ok()) << buffers.status();
  EXPECT_EQ((*buffers)->undo_area(), nullptr);
  EXPECT_EQ((*buffers)->undo_area_bytes(), 0);
}

TEST_F(SharedMemoryUndoAreaTest, AMisalignedOffsetIsRefusedNamingIt) {
  request_.undo_offset = 320;  // a multiple of 64, not of 256
  ExpectRefusedNaming("undo_area.segment_offset");
}

TEST_F(SharedMemoryUndoAreaTest,
       AnAreaOutsideTheSegmentIsRefusedNamingTheField) {
  request_.undo_offset = kBytes + 256;
  ExpectRefusedNaming("undo_area.segment_offset");
  request_.undo_offset = -256;
  ExpectRefusedNaming("undo_area.segment_offset");
  // Starts inside, runs past the end.
  request_.undo_offset = kBytes - 4096;
  ExpectRefusedNaming("undo_area.bytes");
  request_.undo_offset = 256;
  request_.undo_bytes = -1;
  ExpectRefusedNaming("undo_area.bytes");
}

TEST_F(SharedMemoryUndoAreaTest, AnAreaOverTheStepRecordIsRefused) {
  request_.undo_offset = 0;
  ExpectRefusedNaming("undo_area.segment_offset");
}

}  // namespace
}  // namespace worker
}  // namespace muonps
