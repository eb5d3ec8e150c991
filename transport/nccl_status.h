// Helpers of NcclTransport's two source files (nccl_transport.cc: set-up,
// state and abort; nccl_transport_calls.cc: the queued calls and waits):
// deadlines, and NCCL results as absl::Status, in the
// form and codes of common/cuda_status.h (which converts their CUDA errors).
// Internal to transport/. Thread-safe: pure functions, except that
// NcclText reads the communicator's last error.
#ifndef MUONPS_TRANSPORT_NCCL_STATUS_H_
#define MUONPS_TRANSPORT_NCCL_STATUS_H_

#include <nccl.h>

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muonps {
namespace transport {
namespace nccl {

using Clock = std::chrono::steady_clock;

// Now plus `timeout`, clamped so an infinite timeout cannot overflow.
Clock::time_point DeadlineAfter(absl::Duration timeout);

// ncclSuccess or ncclInProgress (non-blocking communicators).
bool Accepted(ncclResult_t result);

// OK for ncclSuccess; UNAVAILABLE for system and remote errors (a lost or
// failing peer or network; another plan may do without it);
// INVALID_ARGUMENT for ncclInvalidArgument; INTERNAL for the rest (a CUDA
// error inside NCCL, NCCL's internal errors, misuse of its calls, and
// ncclInProgress, which callers test with Accepted before converting).
absl::StatusCode CodeFor(ncclResult_t result);

// OK for ncclSuccess; otherwise a status with CodeFor's code and the
// message "<what>: <result name>: <NCCL's error string>[ (<comm's last
// error>)]", e.g. "ncclGroupEnd: ncclRemoteError: remote process exited or
// there was a network error (...)". `comm` may be null.
absl::Status NcclStatus(ncclResult_t result, absl::string_view what,
                        ncclComm_t comm);

// "<result name>: <NCCL's error string>[ (<comm's last error>)]": the
// message NcclStatus puts after `what`.
std::string NcclText(ncclResult_t result, ncclComm_t comm);

}  // namespace nccl
}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_NCCL_STATUS_H_
