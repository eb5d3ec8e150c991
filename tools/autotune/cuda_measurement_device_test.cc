#include "tools/autotune/cuda_measurement_device.h"

#include "gtest/gtest.h"

namespace muonps {
namespace autotune {
namespace {

// On a machine with no GPU (CI), Create reports it; on one with a GPU it
// works and allocates.
TEST(CudaMeasurementDeviceTest, CreateFailsCleanlyWithoutAGpuOrAllocates) {
  absl::StatusOr<std::unique_ptr<CudaMeasurementDevice>> device =
      CudaMeasurementDevice::Create(0);
  if (!device.ok()) {
    EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(device.status().message().find("device"), absl::string_view::npos)
        << device.status();
    return;
  }
  EXPECT_FALSE((*device)->name().empty());
  absl::StatusOr<float*> data = (*device)->Allocate(1024);
  ASSERT_TRUE(data.ok()) << data.status();
  (*device)->Free(*data);
  EXPECT_TRUE((*device)->Synchronize().ok());
}

TEST(CudaMeasurementDeviceTest, NegativeDeviceIsRejected) {
  EXPECT_EQ(CudaMeasurementDevice::Create(-1).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace autotune
}  // namespace muonps
