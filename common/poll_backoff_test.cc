#include "common/poll_backoff.h"

#include <algorithm>
#include <chrono>

#include "gtest/gtest.h"

namespace muonps {
namespace {

using Clock = std::chrono::steady_clock;

// Within kPollSpinFor a wait only yields; past it, it sleeps at least the
// pauses it promises (a lower bound: a loaded machine may sleep longer).
// One yield can outlast the whole window when the machine is loaded (the
// thread is not run again within kPollSpinFor), so the window is tried on
// fresh backoffs until one sees this thread run in it more than once.
TEST(PollBackoffTest, YieldsFirstThenSleepsGrowingPausesUpToTheLongest) {
  int spins = 0;
  for (int attempt = 0; attempt < 50 && spins <= 1; ++attempt) {
    PollBackoff fresh;
    const Clock::time_point start = Clock::now();
    spins = 0;
    while (Clock::now() - start < absl::ToChronoNanoseconds(kPollSpinFor)) {
      fresh.Pause();
      ++spins;
    }
  }
  EXPECT_GT(spins, 1);
  PollBackoff backoff;
  const Clock::time_point start = Clock::now();
  while (Clock::now() - start < absl::ToChronoNanoseconds(kPollSpinFor)) {
    backoff.Pause();
  }
  const Clock::time_point sleeping = Clock::now();
  constexpr int kPauses = 8;
  for (int i = 0; i < kPauses; ++i) backoff.Pause();
  absl::Duration promised;
  absl::Duration pause = kPollFirstPause;
  for (int i = 0; i < kPauses; ++i) {
    promised += pause;
    pause = std::min(pause * 2, kPollLongestPause);
  }
  EXPECT_GE(absl::FromChrono(Clock::now() - sleeping), promised);
}

}  // namespace
}  // namespace muonps
