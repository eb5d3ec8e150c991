#include "tools/autotune/cuda_measurement_device.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace autotune {
namespace {

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorName(error),
                                          " (", cudaGetErrorString(error),
                                          ")"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaMeasurementDevice>>
CudaMeasurementDevice::Create(int device) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess || device < 0 || device >= count) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "device",
        absl::StrCat(
            "GPU ", device, " is not available (", count, " GPUs visible",
            error == cudaSuccess ? std::string()
                                 : absl::StrCat("; ", cudaGetErrorName(error)),
            ")"));
  }
  MUONPS_RETURN_IF_ERROR(CudaError(cudaSetDevice(device), "cudaSetDevice"));
  cudaDeviceProp properties;
  MUONPS_RETURN_IF_ERROR(CudaError(cudaGetDeviceProperties(&properties, device),
                                   "cudaGetDeviceProperties"));
  return std::unique_ptr<CudaMeasurementDevice>(
      new CudaMeasurementDevice(device, properties.name));
}

absl::StatusOr<float*> CudaMeasurementDevice::Allocate(int64_t count) {
  if (count <= 0) {
    return InvalidField("count", absl::StrCat(count, " must be > 0"));
  }
  void* data = nullptr;
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  const cudaError_t error = cudaMalloc(&data, bytes);
  if (error != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky: clear it
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    return FieldError(
        absl::StatusCode::kResourceExhausted, "count",
        absl::StrCat("cudaMalloc of ", bytes, " bytes on GPU ", device_,
                     " failed (", cudaGetErrorName(error), "); ", free_bytes,
                     " of ", total_bytes, " bytes free"));
  }
  return static_cast<float*>(data);
}

void CudaMeasurementDevice::Free(float* data) {
  if (data != nullptr) cudaFree(data);
}

absl::Status CudaMeasurementDevice::CopyFromHost(absl::Span<const float> host,
                                                 float* device) {
  if (device == nullptr) return InvalidField("device", "is null");
  return CudaError(cudaMemcpy(device, host.data(), host.size() * sizeof(float),
                              cudaMemcpyHostToDevice),
                   "cudaMemcpy to the device");
}

absl::Status CudaMeasurementDevice::Synchronize() {
  MUONPS_RETURN_IF_ERROR(
      CudaError(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  return CudaError(cudaGetLastError(), "a kernel launch");
}

}  // namespace autotune
}  // namespace muonps
