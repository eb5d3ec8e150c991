// The cuda_ipc library's shared CUDA helpers (cuda_ipc_internal.h): device
// ordinal checks.
#include "lending/cuda_ipc_internal.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace cuda_ipc_internal {

absl::Status CheckDevice(int device) {
  int count = 0;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount"));
  if (device < 0 || device >= count) {
    return InvalidField("device", absl::StrCat(device, ": this process sees ",
                                               count, " CUDA device(s)"));
  }
  return absl::OkStatus();
}

}  // namespace cuda_ipc_internal
}  // namespace muonps
