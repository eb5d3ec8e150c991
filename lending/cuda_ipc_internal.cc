// The cuda_ipc library's shared CUDA helpers (cuda_ipc_internal.h): driver
// error names and device ordinal checks.
#include "lending/cuda_ipc_internal.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace cuda_ipc_internal {

std::string DriverErrorText(CUresult result) {
  std::string text = absl::StrCat("CUresult ", static_cast<int>(result));
  absl::StatusOr<PFN_cuGetErrorName_v6000> name_of =
      DriverEntryPoint<PFN_cuGetErrorName_v6000>("cuGetErrorName");
  const char* name = nullptr;
  if (name_of.ok() && (*name_of)(result, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    absl::StrAppend(&text, " (", name, ")");
  }
  return text;
}

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
