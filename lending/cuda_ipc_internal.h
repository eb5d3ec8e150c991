// The CUDA runtime and driver helpers that the cuda_ipc library's .cc files
// share: driver entry points found through the runtime, driver error names,
// and running a call with a device current. CUDA runtime errors convert
// through common/cuda_status.h. Private to the
// cuda_ipc target (listed in its srcs); not part of its API.
#ifndef MUONPS_LENDING_CUDA_IPC_INTERNAL_H_
#define MUONPS_LENDING_CUDA_IPC_INTERNAL_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/cuda_status.h"
#include "common/status.h"

namespace muonps {
namespace cuda_ipc_internal {

// The driver ABI version we ask entry points for. cuMemGetAddressRange_v2
// and cuGetErrorName have been stable since CUDA 3.2 and 6.0; asking for a
// version newer than the installed driver fails, so ask for an old one.
constexpr unsigned int kDriverApiVersion = 12000;

// A driver API function, found through the runtime so that nothing links
// libcuda (the GPU machine's driver provides it at run time). Null when the
// driver lacks it.
template <typename Fn>
absl::StatusOr<Fn> DriverEntryPoint(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaGetDriverEntryPointByVersion(symbol, &fn, kDriverApiVersion,
                                       cudaEnableDefault, &found),
      absl::StrCat("cudaGetDriverEntryPointByVersion(", symbol, ")")));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "the CUDA driver has no ", symbol, " (entry point query result ",
        static_cast<int>(found), ")"));
  }
  return reinterpret_cast<Fn>(fn);
}

// "CUresult <n> (<name>)" for a failed driver call; the name is left out
// where the driver cannot give it.
std::string DriverErrorText(CUresult result);

// INVALID_ARGUMENT naming "device" unless `device` is an ordinal this
// process sees; UNAVAILABLE when CUDA cannot count the devices.
absl::Status CheckDevice(int device);

}  // namespace cuda_ipc_internal
}  // namespace muonps

#endif  // MUONPS_LENDING_CUDA_IPC_INTERNAL_H_
