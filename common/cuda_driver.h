// The CUDA driver calls muonps makes, found through the runtime
// (cudaGetDriverEntryPointByVersion) so that nothing links libcuda: the GPU
// machine's driver provides them at run time. Besides the lookup itself and
// the driver's error names, the stream memory operations on a 64-bit word
// (cuStreamWriteValue64, cuStreamWaitValue64): a stream writes the word after
// its earlier work, or waits for a value in it, so that streams of two
// processes or two devices order on a word with no host waiting (a trainer's
// step counter and step record, lending/; the landed words of the staging
// windows, server/worker/staging_windows.h, through kernels::DeviceOps).
//
// The word is 8-byte aligned memory the stream's device can reach (its own
// memory, or another device's mapped here by CUDA IPC). Errors: UNAVAILABLE
// when the driver lacks a call or refuses it, the message naming the call
// and the driver's error. Thread-safe (pure functions of their arguments).
#ifndef MUONPS_COMMON_CUDA_DRIVER_H_
#define MUONPS_COMMON_CUDA_DRIVER_H_

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/device.h"
#include "common/status.h"

namespace muonps {

// The driver ABI version entry points are asked for. Asking for a version
// newer than the installed driver fails, so ask for an old one: every call
// found through here has been stable since it.
inline constexpr unsigned int kDriverApiVersion = 12000;

// The driver function `symbol`, as the pointer type `Fn` (one of
// cudaTypedefs.h's PFN_ types). UNAVAILABLE when the driver lacks it; the
// runtime's error when the lookup itself fails.
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

// Enqueues on `stream` the write of `value` to the word at `device_address`
// after the work enqueued on it so far, with a memory barrier before it:
// that work's writes are visible to whoever sees the value.
absl::Status StreamWriteValue(Stream stream, void* device_address,
                              uint64_t value);

// Work enqueued on `stream` after this call starts only once the word at
// `device_address` is >= `value` (StreamWaitAtLeast) or == `value`
// (StreamWaitEqual). The device waits with no timeout: only a write of the
// value releases the stream.
absl::Status StreamWaitAtLeast(Stream stream, const void* device_address,
                               uint64_t value);
absl::Status StreamWaitEqual(Stream stream, const void* device_address,
                             uint64_t value);

}  // namespace muonps

#endif  // MUONPS_COMMON_CUDA_DRIVER_H_
