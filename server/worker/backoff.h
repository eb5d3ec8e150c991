// Backoff: the waits between a worker's retries of a call to the
// coordinator, exponential from 100 ms up to 2 s with +-25% jitter (so
// restarted workers do not all knock at once). Not thread-safe: one per
// retrying loop.
#ifndef MUONPS_SERVER_WORKER_BACKOFF_H_
#define MUONPS_SERVER_WORKER_BACKOFF_H_

#include <algorithm>
#include <random>

#include "absl/time/time.h"

namespace muonps {
namespace worker {

class Backoff {
 public:
  // The next wait; each is about twice the one before, up to 2 s.
  absl::Duration Next() {
    const absl::Duration out =
        current_ * std::uniform_real_distribution<double>(0.75, 1.25)(random_);
    current_ = std::min(current_ * 2, absl::Seconds(2));
    return out;
  }
  // The next wait is the first again (about 100 ms).
  void Reset() { current_ = absl::Milliseconds(100); }

 private:
  absl::Duration current_ = absl::Milliseconds(100);
  std::minstd_rand random_{std::random_device()()};
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_BACKOFF_H_
