// Helpers of NcclTransport's two source files (nccl_transport.cc: set-up,
// state and abort; nccl_transport_calls.cc: the queued calls and waits):
// polling pauses and deadlines, and NCCL and CUDA results as absl::Status
// (a lost peer or network is UNAVAILABLE; the rest INTERNAL, or
// RESOURCE_EXHAUSTED for CUDA out-of-memory). Internal to transport/.
#ifndef MUONPS_TRANSPORT_NCCL_STATUS_H_
#define MUONPS_TRANSPORT_NCCL_STATUS_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muonps {
namespace transport {
namespace nccl {

using Clock = std::chrono::steady_clock;

// Polling pauses: short at first (NCCL usually finishes within a few
// hundred microseconds), then at most 1 ms so a wait costs little CPU.
inline constexpr absl::Duration kFirstPause = absl::Microseconds(100);
inline constexpr absl::Duration kLongestPause = absl::Milliseconds(1);

// Sleeps `*pause`, then doubles it up to kLongestPause.
void Pause(absl::Duration* pause);

// Now plus `timeout`, clamped so an infinite timeout cannot overflow.
Clock::time_point DeadlineAfter(absl::Duration timeout);

// ncclSuccess or ncclInProgress (non-blocking communicators).
bool Accepted(ncclResult_t result);

// UNAVAILABLE for system and remote errors (a lost or failing peer or
// network), INTERNAL for the rest (CUDA errors, internal errors, misuse).
absl::StatusCode CodeFor(ncclResult_t result);

// `what`: NCCL's error string and last error message for `comm`.
absl::Status NcclStatus(ncclResult_t result, absl::string_view what,
                        ncclComm_t comm);
std::string NcclText(ncclResult_t result, ncclComm_t comm);

// `what`: the CUDA error's name and string.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

}  // namespace nccl
}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_NCCL_STATUS_H_
