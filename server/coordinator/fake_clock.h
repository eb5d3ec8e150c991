// FakeClock: time that moves only when a test advances it, for
// the Coordinator's clock (`[&clock] { return clock.Now(); }`).
//
// Thread-safe: the coordinator's threads read it while a test advances it.
// Tests only (testonly in BUILD).
#ifndef MUONPS_SERVER_COORDINATOR_FAKE_CLOCK_H_
#define MUONPS_SERVER_COORDINATOR_FAKE_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace muonps {
namespace coordinator {

class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_FAKE_CLOCK_H_
