// How a host thread paces its polls of work that finishes on its own (an
// NCCL call, a CUDA event): yield at first, then sleep growing pauses.
#ifndef MUONPS_COMMON_POLL_BACKOFF_H_
#define MUONPS_COMMON_POLL_BACKOFF_H_

#include <chrono>

#include "absl/time/time.h"

namespace muonps {

// A non-blocking NCCL communicator's group launches from a thread of
// NCCL's and reports ncclInProgress for some tens of microseconds, and a
// step's control message arrives within about as long once its peer sends
// it: a sleep of even 100 us there cost every NCCL call and control
// message of a step twice what NCCL took (0.2 ms a call on an H200). So a
// wait yields the CPU without sleeping for its first kPollSpinFor, then
// sleeps from kPollFirstPause, doubling to kPollLongestPause, so a long
// wait (a peer's backward, a stage's transfers, the trainer's backward)
// costs little CPU and overshoots by little.
inline constexpr absl::Duration kPollSpinFor = absl::Milliseconds(1);
inline constexpr absl::Duration kPollFirstPause = absl::Microseconds(20);
inline constexpr absl::Duration kPollLongestPause = absl::Microseconds(200);

// One wait's pacing: Pause() between two polls. Not thread-safe (one
// waiting thread).
class PollBackoff {
 public:
  PollBackoff();
  // Yields within kPollSpinFor of construction, sleeps afterwards.
  void Pause();

 private:
  std::chrono::steady_clock::time_point spin_until_;
  absl::Duration pause_ = kPollFirstPause;
};

}  // namespace muonps

#endif  // MUONPS_COMMON_POLL_BACKOFF_H_
