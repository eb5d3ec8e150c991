#include "common/poll_backoff.h"

#include <algorithm>
#include <thread>

#include "absl/time/clock.h"

namespace muonps {

PollBackoff::PollBackoff()
    : spin_until_(std::chrono::steady_clock::now() +
                  absl::ToChronoNanoseconds(kPollSpinFor)) {}

void PollBackoff::Pause() {
  if (std::chrono::steady_clock::now() < spin_until_) {
    std::this_thread::yield();
    return;
  }
  absl::SleepFor(pause_);
  pause_ = std::min(pause_ * 2, kPollLongestPause);
}

}  // namespace muonps
