// OnDevice: runs work with a given CUDA device current on the calling
// thread and restores the thread's previous one, so a library that serves
// a framework's thread (a trainer's client, a worker's IPC mappings) never
// leaves that thread on another device. Depends on cudart only.
#ifndef MUONPS_COMMON_CUDA_DEVICE_H_
#define MUONPS_COMMON_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"

namespace muonps {

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

}  // namespace muonps

#endif  // MUONPS_COMMON_CUDA_DEVICE_H_
