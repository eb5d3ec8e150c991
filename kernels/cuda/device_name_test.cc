// CudaDeviceName on any machine: a name on a GPU machine, a clean status
// naming the device where there is no GPU (CI), never a crash.
#include "kernels/cuda/device_name.h"

#include <cuda_runtime.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

using ::testing::HasSubstr;

TEST(CudaDeviceNameTest, NamesTheGpuOrFailsCleanlyWithoutOne) {
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  cudaGetLastError();
  const absl::StatusOr<std::string> name = CudaDeviceName(0);
  if (gpu) {
    ASSERT_TRUE(name.ok()) << name.status();
    EXPECT_FALSE(name->empty());
    return;
  }
  ASSERT_FALSE(name.ok());
  EXPECT_THAT(std::string(name.status().message()), HasSubstr("device"));
}

TEST(CudaDeviceNameTest, NegativeDeviceIsRejectedByName) {
  const absl::StatusOr<std::string> name = CudaDeviceName(-1);
  EXPECT_EQ(name.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(name.status().message()), HasSubstr("device"));
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
