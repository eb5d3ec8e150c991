#include "kernels/cuda/device_name.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace cuda {

absl::StatusOr<std::string> CudaDeviceName(int device) {
  if (device < 0) {
    return InvalidField("device", absl::StrCat(device, " must be >= 0"));
  }
  cudaDeviceProp properties{};
  const cudaError_t error = cudaGetDeviceProperties(&properties, device);
  if (error != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it for later callers
    return CudaStatus(
        error, absl::StrCat("device: cudaGetDeviceProperties(", device, ")"));
  }
  return std::string(properties.name);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
