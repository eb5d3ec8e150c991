// CudaStatus (cuda_status.h): the codes of every CUDA runtime error.
#include "common/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace {

// The mapping cuda_status.h documents, group by group.
absl::StatusCode CodeFor(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return absl::StatusCode::kOk;

    case cudaErrorMemoryAllocation:
    case cudaErrorTooManyPeers:
    case cudaErrorMpsMaxClientsReached:
    case cudaErrorMpsMaxConnectionsReached:
      return absl::StatusCode::kResourceExhausted;

    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidPitchValue:
    case cudaErrorInvalidSymbol:
    case cudaErrorInvalidHostPointer:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
    case cudaErrorMemoryValueTooLarge:
    case cudaErrorInvalidDeviceFunction:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidResourceType:
    case cudaErrorInvalidResourceConfiguration:
    case cudaErrorLaunchOutOfResources:
    case cudaErrorCooperativeLaunchTooLarge:
    case cudaErrorInvalidClusterSize:
      return absl::StatusCode::kInvalidArgument;

    case cudaErrorPeerAccessUnsupported:
    case cudaErrorPeerAccessNotEnabled:
    case cudaErrorPeerAccessAlreadyEnabled:
    case cudaErrorNotSupported:
    case cudaErrorNotPermitted:
    case cudaErrorSetOnActiveProcess:
    case cudaErrorContextIsDestroyed:
    case cudaErrorDeviceUninitialized:
    case cudaErrorIllegalState:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorGraphExecUpdateFailure:
      return absl::StatusCode::kFailedPrecondition;

    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorSystemNotReady:
    case cudaErrorDevicesUnavailable:
    case cudaErrorDeviceAlreadyInUse:
    case cudaErrorDeviceNotLicensed:
    case cudaErrorInitializationError:
    case cudaErrorStartupFailure:
    case cudaErrorCudartUnloading:
    case cudaErrorMpsConnectionFailed:
    case cudaErrorMpsRpcFailure:
    case cudaErrorMpsServerNotReady:
    case cudaErrorMpsClientTerminated:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContained:
    case cudaErrorLaunchTimeout:
    case cudaErrorTimeout:
    case cudaErrorExternalDevice:
      return absl::StatusCode::kUnavailable;

    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  return absl::Status(CodeFor(error),
                      absl::StrCat(what, ": ", cudaGetErrorName(error), ": ",
                                   cudaGetErrorString(error)));
}

}  // namespace muonps
