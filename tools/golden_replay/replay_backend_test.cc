// Backend and tolerance choice of golden_replay: the CPU backend runs fp32
// only, unknown names are rejected naming the flag, and --backend cuda on a
// machine without a usable GPU is a clean UNAVAILABLE (with a GPU, the CUDA
// backend starts).
#include "tools/golden_replay/replay_backend.h"

#include <cuda_runtime.h>

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace golden {
namespace {

using ::testing::HasSubstr;

BackendFlags Flags(const std::string& backend, const std::string& precision) {
  BackendFlags flags;
  flags.backend = backend;
  flags.precision = precision;
  flags.threads = 1;
  return flags;
}

TEST(ReplayBackendTest, CpuRunsFp32Only) {
  const auto cpu = MakeReplayBackend(Flags("cpu", "fp32"));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->backend_name(), "cpu");
  for (const char* precision : {"bf16", "fp16"}) {
    const auto rejected = MakeReplayBackend(Flags("cpu", precision));
    ASSERT_FALSE(rejected.ok());
    EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(rejected.status().message()),
                HasSubstr("precision"));
  }
}

TEST(ReplayBackendTest, UnknownNamesAreRejectedNamingTheFlag) {
  const auto backend = MakeReplayBackend(Flags("tpu", "fp32"));
  ASSERT_FALSE(backend.ok());
  EXPECT_THAT(std::string(backend.status().message()), HasSubstr("backend"));
  const auto precision = MakeReplayBackend(Flags("cuda", "fp8"));
  ASSERT_FALSE(precision.ok());
  EXPECT_THAT(std::string(precision.status().message()),
              HasSubstr("precision"));
  EXPECT_FALSE(TolerancesFor("int8", NsAlgorithm::kNs5).ok());
}

TEST(ReplayBackendTest, CudaWithoutAGpuIsUnavailableNotACrash) {
  int devices = 0;
  const bool gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  const auto cuda = MakeReplayBackend(Flags("cuda", "bf16"));
  if (gpu) {
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    EXPECT_EQ((*cuda)->backend_name(), "cuda");
    return;
  }
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(cuda.status().message()), HasSubstr("GPU"));
}

TEST(ReplayBackendTest, SixteenBitTolerancesLoosenOnlyWhatNsRoundingMoves) {
  const NsAlgorithm ns5 = NsAlgorithm::kNs5;
  const auto fp32 = TolerancesFor("fp32", ns5);
  const auto bf16 = TolerancesFor("bf16", ns5);
  const auto fp16 = TolerancesFor("fp16", ns5);
  ASSERT_TRUE(fp32.ok() && bf16.ok() && fp16.ok());
  EXPECT_EQ(fp32->muon_param, Tolerances().muon_param);
  EXPECT_EQ(fp32->ns_output, Tolerances().ns_output);
  EXPECT_EQ(bf16->muon_param, 1e-2);
  EXPECT_EQ(fp16->muon_param, 1e-2);
  EXPECT_EQ(bf16->ns_output, 8e-2);
  EXPECT_EQ(TolerancesFor("bf16", NsAlgorithm::kGram)->ns_output, 0.15);
  EXPECT_EQ(fp16->ns_output, fp32->ns_output);
  for (const Tolerances& t : {*bf16, *fp16}) {
    EXPECT_EQ(t.momentum, fp32->momentum);
    EXPECT_EQ(t.adamw_param, fp32->adamw_param);
  }
}

}  // namespace
}  // namespace golden
}  // namespace muonps
