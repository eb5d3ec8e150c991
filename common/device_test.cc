#include "common/device.h"

#include "gtest/gtest.h"

namespace muonps {
namespace {

TEST(DeviceTest, ParsesCpuAndCudaOrdinalsAndNamesThemBack) {
  EXPECT_EQ(*ParseDevice("cpu"), kHostDevice);
  EXPECT_EQ(*ParseDevice("cuda"), (Device{MemoryKind::kCuda, 0}));
  EXPECT_EQ(*ParseDevice("cuda:3"), (Device{MemoryKind::kCuda, 3}));
  EXPECT_EQ(DeviceName(*ParseDevice("cuda:3")), "cuda:3");
  EXPECT_EQ(DeviceName(kHostDevice), "cpu");
}

TEST(DeviceTest, RefusesAnythingElseNamingTheField) {
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1x"}) {
    absl::StatusOr<Device> parsed = ParseDevice(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("device"), std::string::npos);
  }
}

}  // namespace
}  // namespace muonps
