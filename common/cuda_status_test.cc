// CudaStatus's codes and message for each group of cuda_status.h's
// mapping. Runs without a GPU: cudart names and describes errors without a
// device or driver.
#include "common/cuda_status.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(CudaStatusTest, SuccessIsOk) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "cudaMalloc").ok());
}

TEST(CudaStatusTest, MessageNamesWhatThenTheErrorNameThenItsDescription) {
  const absl::Status status =
      CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(staging arena)");
  EXPECT_THAT(std::string(status.message()),
              StartsWith("cudaMalloc(staging arena): "
                         "cudaErrorMemoryAllocation: "));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(cudaGetErrorString(cudaErrorMemoryAllocation)));
}

TEST(CudaStatusTest, OutOfMemoryIsResourceExhausted) {
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorTooManyPeers, "x").code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(CudaStatusTest, BadArgumentsAndImpossibleLaunchesAreInvalidArgument) {
  for (cudaError_t e :
       {cudaErrorInvalidValue, cudaErrorInvalidDevice,
        cudaErrorInvalidDevicePointer, cudaErrorInvalidResourceHandle,
        cudaErrorInvalidConfiguration, cudaErrorLaunchOutOfResources}) {
    EXPECT_EQ(CudaStatus(e, "x").code(), absl::StatusCode::kInvalidArgument)
        << cudaGetErrorName(e);
  }
}

TEST(CudaStatusTest, UnsupportedPeerAccessOrIpcIsFailedPrecondition) {
  for (cudaError_t e :
       {cudaErrorPeerAccessUnsupported, cudaErrorPeerAccessNotEnabled,
        cudaErrorNotSupported, cudaErrorNotPermitted,
        cudaErrorNoKernelImageForDevice, cudaErrorStreamCaptureUnsupported}) {
    EXPECT_EQ(CudaStatus(e, "x").code(), absl::StatusCode::kFailedPrecondition)
        << cudaGetErrorName(e);
  }
}

TEST(CudaStatusTest, NoUsableDeviceOrALostOneIsUnavailable) {
  for (cudaError_t e :
       {cudaErrorNoDevice, cudaErrorInsufficientDriver,
        cudaErrorDevicesUnavailable, cudaErrorStubLibrary,
        cudaErrorECCUncorrectable, cudaErrorInitializationError}) {
    EXPECT_EQ(CudaStatus(e, "x").code(), absl::StatusCode::kUnavailable)
        << cudaGetErrorName(e);
  }
}

TEST(CudaStatusTest, FaultedKernelsAndUnknownErrorsAreInternal) {
  for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchFailure,
                        cudaErrorMisalignedAddress, cudaErrorAssert,
                        cudaErrorUnknown, cudaErrorNotReady}) {
    EXPECT_EQ(CudaStatus(e, "x").code(), absl::StatusCode::kInternal)
        << cudaGetErrorName(e);
  }
}

absl::Status ReturnsThroughTheMacro(cudaError_t e) {
  MUONPS_CUDA_RETURN_IF_ERROR(e);
  return absl::AbortedError("not returned early");
}

TEST(CudaStatusTest, MacroReturnsTheFailureNamingTheCallAsWritten) {
  const absl::Status status = ReturnsThroughTheMacro(cudaErrorInvalidValue);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              StartsWith("e: cudaErrorInvalidValue: "));
  EXPECT_EQ(ReturnsThroughTheMacro(cudaSuccess).code(),
            absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace muonps
