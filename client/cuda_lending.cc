#include "client/cuda_lending.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_ipc.h"
#include "common/status.h"

namespace muonps {
namespace client_internal {

absl::StatusOr<v1::CudaBuffer> ExportCudaBuffer(const float* data,
                                                int64_t elements,
                                                const Device& device,
                                                const std::string& what) {
  if (data == nullptr || elements < 1) {
    return InvalidField(what, "needs a device buffer of at least 1 float");
  }
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess ||
      attributes.type != cudaMemoryTypeDevice) {
    cudaGetLastError();
    return InvalidField(what, "is not CUDA device memory");
  }
  if (attributes.device != device.ordinal) {
    return InvalidField(
        what, absl::StrCat("is memory of cuda:", attributes.device, ", not of ",
                           DeviceName(device)));
  }
  absl::StatusOr<IpcMemoryRef> ref =
      ExportDeviceMemory(data, static_cast<uint64_t>(elements) * sizeof(float));
  if (!ref.ok()) return Annotate(ref.status(), what);
  v1::CudaBuffer out;
  out.set_ipc_handle(ref->handle);
  out.set_offset(static_cast<int64_t>(ref->offset));
  return out;
}

absl::Status WaitForTrainerStream(const Device& device, Stream stream) {
  cudaError_t error = cudaSetDevice(device.ordinal);
  if (error == cudaSuccess) {
    error = stream == kHostStream
                ? cudaDeviceSynchronize()
                : cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
  }
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("waiting for the trainer's stream: ",
                                          cudaGetErrorString(error)));
}

}  // namespace client_internal
}  // namespace muonps
