// CudaStatus: the one conversion of a CUDA runtime error code into an
// absl::Status, used by every folder that calls the CUDA runtime (kernels,
// lending, transport, client, server, benchmarks, tests), so that the same
// CUDA failure reads the same, and carries the same code, wherever it
// happens. Depends on cudart only; needs no GPU (cudaGetErrorName and
// cudaGetErrorString work without a device or driver).
//
// Thread-safe: a pure function of its arguments, except that it clears the
// calling thread's last CUDA runtime error (see below).
#ifndef MUONPS_COMMON_CUDA_STATUS_H_
#define MUONPS_COMMON_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace muonps {

// OK for cudaSuccess. Otherwise a status whose message is
// "<what>: <CUDA error name>: <CUDA error description>", e.g.
// "cudaMalloc(staging arena): cudaErrorMemoryAllocation: out of memory",
// where `what` names the call or the thing it was doing. Its code, by what
// the caller can do about the failure:
//
//   RESOURCE_EXHAUSTED   a resource that frees up is used up: device
//                        memory (cudaErrorMemoryAllocation), peer mappings
//                        (cudaErrorTooManyPeers), MPS clients or
//                        connections.
//   INVALID_ARGUMENT     the call's arguments are wrong: invalid value,
//                        device ordinal, device or host pointer, handle
//                        (stream, event, IPC), symbol, pitch, copy
//                        direction; a launch configuration the device can
//                        never run (invalid configuration, too many
//                        resources or cluster size for one block, a
//                        cooperative launch too large).
//   FAILED_PRECONDITION  the call is well formed but this system or state
//                        cannot do it: peer access unsupported, not enabled
//                        or already enabled, an operation (CUDA IPC among
//                        them) not supported or not permitted here, a
//                        destroyed or uninitialized context, host memory
//                        already (or not) registered, stream capture rules,
//                        no kernel image for this GPU.
//   UNAVAILABLE          no usable device or driver now, or the device is
//                        lost; another process, machine or a later attempt
//                        may succeed: no device, driver too old or
//                        mismatched, stub library, devices unavailable or
//                        in exclusive use, initialization or start-up
//                        failure, the runtime unloading, MPS server or
//                        connection failures, uncorrectable ECC or NVLink
//                        errors, contained errors, timeouts.
//   INTERNAL             the rest, above all a kernel that faulted (illegal
//                        address or instruction, misaligned address,
//                        launch failure, device assert, prior launch
//                        failure) and cudaErrorUnknown: a bug here, and
//                        the context is usually unusable after it.
//
// cudaErrorNotReady is not a failure of the call: callers that poll
// (cudaStreamQuery, cudaEventQuery) test for it before converting; passed
// here it is INTERNAL.
//
// Also clears the calling thread's last runtime error (cudaGetLastError),
// so that a later launch check elsewhere does not report this failure as
// its own; sticky errors (a faulted kernel) stay, as CUDA keeps them.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

}  // namespace muonps

// Returns CudaStatus((expr), "<expr as written>") from the enclosing
// function unless the CUDA runtime call `expr` returns cudaSuccess.
#define MUONPS_CUDA_RETURN_IF_ERROR(expr) \
  MUONPS_RETURN_IF_ERROR(::muonps::CudaStatus((expr), #expr))

#endif  // MUONPS_COMMON_CUDA_STATUS_H_
