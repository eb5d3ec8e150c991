// The CUDA runtime helpers that the cuda_ipc library's .cc files share:
// device ordinal checks and running a call with a device current. CUDA
// runtime errors convert through common/cuda_status.h, driver calls go
// through common/cuda_driver.h. Private to the
// cuda_ipc target (listed in its srcs); not part of its API.
#ifndef MUONPS_LENDING_CUDA_IPC_INTERNAL_H_
#define MUONPS_LENDING_CUDA_IPC_INTERNAL_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/cuda_status.h"
#include "common/status.h"

namespace muonps {
namespace cuda_ipc_internal {

// INVALID_ARGUMENT naming "device" unless `device` is an ordinal this
// process sees; UNAVAILABLE when CUDA cannot count the devices.
absl::Status CheckDevice(int device);

// Runs `body` with `device` current on this thread, then restores the
// thread's previous current device. `body` returns a Status or StatusOr.
// cudaSetDevice runs even when `device` is already the current one: it also
// makes the device's primary context current on this thread, which the
// driver calls (cuMemGetAddressRange) need and a fresh thread lacks.
template <typename Body>
auto OnDevice(int device, Body&& body) -> decltype(body()) {
  int previous = 0;
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&previous), "cudaGetDevice"));
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")")));
  auto result = body();
  if (previous != device) (void)cudaSetDevice(previous);
  return result;
}

}  // namespace cuda_ipc_internal
}  // namespace muonps

#endif  // MUONPS_LENDING_CUDA_IPC_INTERNAL_H_
