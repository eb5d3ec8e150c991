// Helpers of NcclTransport's two source files (nccl_transport.cc: set-up,
// state and abort; nccl_transport_calls.cc: the queued calls and waits):
// polling pauses and deadlines, and NCCL results as absl::Status, in the
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

// How the host polls NCCL's state or a stream. A non-blocking
// communicator's group launches from a thread of NCCL's and reports
// ncclInProgress for some tens of microseconds, and a step's control
// message arrives within about as long once its peer sends it: a sleep of
// even 100 us there cost every NCCL call and control message of a step
// twice what NCCL took (0.2 ms a call on an H200). So a wait yields the CPU
// without sleeping for its first kSpinFor, then sleeps from kFirstPause,
// doubling to kLongestPause, so a long wait (a peer's backward, a
// stage's transfers) costs little CPU and overshoots by little.
inline constexpr absl::Duration kSpinFor = absl::Milliseconds(1);
inline constexpr absl::Duration kFirstPause = absl::Microseconds(20);
inline constexpr absl::Duration kLongestPause = absl::Microseconds(200);

// One wait's pacing: Pause() between two polls. Not thread-safe (one
// waiting thread).
class Backoff {
 public:
  Backoff();
  // Yields within kSpinFor of construction, sleeps afterwards.
  void Pause();

 private:
  std::chrono::steady_clock::time_point spin_until_;
  absl::Duration pause_ = kFirstPause;
};

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
