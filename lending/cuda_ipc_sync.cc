// Ordering streams across processes without a host sync: IpcEvent, and the
// stream memory operations on a step counter a trainer shares with its
// worker (StreamWaitAtLeast, StreamWriteValue).
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cuda_device.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "lending/cuda_ipc.h"
#include "lending/cuda_ipc_internal.h"

namespace muonps {
namespace {

using cuda_ipc_internal::CheckDevice;
using cuda_ipc_internal::DriverEntryPoint;
using cuda_ipc_internal::DriverErrorText;

static_assert(sizeof(cudaIpcEventHandle_t) == kCudaIpcHandleBytes,
              "cudaIpcEventHandle_t changed size");

}  // namespace

absl::StatusOr<IpcEvent> IpcEvent::Create(int device) {
  MUONPS_RETURN_IF_ERROR(CheckDevice(device));
  return OnDevice(device, [device]() -> absl::StatusOr<IpcEvent> {
    cudaEvent_t event = nullptr;
    MUONPS_RETURN_IF_ERROR(CudaStatus(
        cudaEventCreateWithFlags(
            &event, cudaEventDisableTiming | cudaEventInterprocess),
        absl::StrCat("cudaEventCreateWithFlags(interprocess) on device ",
                     device)));
    return IpcEvent(event, device);
  });
}

absl::StatusOr<IpcEvent> IpcEvent::Open(const std::string& handle, int device) {
  if (handle.size() != kCudaIpcHandleBytes) {
    return InvalidField("handle",
                        absl::StrCat("has ", handle.size(),
                                     " bytes; a cudaIpcEventHandle_t has ",
                                     kCudaIpcHandleBytes));
  }
  MUONPS_RETURN_IF_ERROR(CheckDevice(device));
  cudaIpcEventHandle_t raw;
  std::memcpy(raw.reserved, handle.data(), kCudaIpcHandleBytes);
  return OnDevice(device, [&]() -> absl::StatusOr<IpcEvent> {
    cudaEvent_t event = nullptr;
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaIpcOpenEventHandle(&event, raw),
                   absl::StrCat("cudaIpcOpenEventHandle on device ", device)));
    return IpcEvent(event, device);
  });
}

IpcEvent::IpcEvent(IpcEvent&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

IpcEvent& IpcEvent::operator=(IpcEvent&& other) noexcept {
  if (this != &other) {
    Destroy();
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

IpcEvent::~IpcEvent() { Destroy(); }

void IpcEvent::Destroy() {
  if (event_ != nullptr) {
    (void)cudaEventDestroy(event_);
    event_ = nullptr;
  }
}

absl::Status IpcEvent::CheckNotEmpty() const {
  if (event_ == nullptr) {
    return absl::FailedPreconditionError("IpcEvent: is empty (moved from)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> IpcEvent::Export() const {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  cudaIpcEventHandle_t handle;
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaIpcGetEventHandle(&handle, event_),
                                    "cudaIpcGetEventHandle"));
  return std::string(handle.reserved, kCudaIpcHandleBytes);
}

absl::Status IpcEvent::Record(Stream stream) {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  // The device matters for kHostStream (that device's default stream).
  return OnDevice(device_, [&]() {
    return CudaStatus(cudaEventRecord(event_, stream),
                      absl::StrFormat("cudaEventRecord(stream %p)", stream));
  });
}

absl::Status IpcEvent::MakeStreamWait(Stream stream) {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  return OnDevice(device_, [&]() {
    return CudaStatus(
        cudaStreamWaitEvent(stream, event_, 0),
        absl::StrFormat("cudaStreamWaitEvent(stream %p)", stream));
  });
}

absl::Status IpcEvent::Synchronize() {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
}

absl::StatusOr<bool> IpcEvent::Done() {
  MUONPS_RETURN_IF_ERROR(CheckNotEmpty());
  const cudaError_t e = cudaEventQuery(event_);
  if (e == cudaErrorNotReady) return false;
  MUONPS_RETURN_IF_ERROR(CudaStatus(e, "cudaEventQuery"));
  return true;
}

absl::Status StreamWaitAtLeast(Stream stream, const void* device_address,
                               uint64_t value) {
  MUONPS_ASSIGN_OR_RETURN(
      PFN_cuStreamWaitValue64_v11070 wait,
      DriverEntryPoint<PFN_cuStreamWaitValue64_v11070>("cuStreamWaitValue64"));
  const CUresult result = wait(reinterpret_cast<CUstream>(stream),
                               reinterpret_cast<CUdeviceptr>(device_address),
                               value, CU_STREAM_WAIT_VALUE_GEQ);
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cuStreamWaitValue64: ", DriverErrorText(result)));
}

absl::Status StreamWriteValue(Stream stream, void* device_address,
                              uint64_t value) {
  MUONPS_ASSIGN_OR_RETURN(PFN_cuStreamWriteValue64_v11070 write,
                          DriverEntryPoint<PFN_cuStreamWriteValue64_v11070>(
                              "cuStreamWriteValue64"));
  const CUresult result = write(reinterpret_cast<CUstream>(stream),
                                reinterpret_cast<CUdeviceptr>(device_address),
                                value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cuStreamWriteValue64: ", DriverErrorText(result)));
}

}  // namespace muonps
