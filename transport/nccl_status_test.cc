// NcclStatus's codes and message form: those of common/cuda_status.h; the
// polling Backoff. Needs no GPU.
#include "transport/nccl_status.h"

#include <chrono>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace transport {
namespace nccl {
namespace {

using ::testing::StartsWith;

TEST(NcclStatusTest, SuccessIsOk) {
  EXPECT_TRUE(NcclStatus(ncclSuccess, "ncclSend", nullptr).ok());
}

TEST(NcclStatusTest, MessageNamesWhatThenTheResultName) {
  const absl::Status status =
      NcclStatus(ncclRemoteError, "ncclGroupEnd", nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()),
              StartsWith("ncclGroupEnd: ncclRemoteError: "));
}

TEST(NcclStatusTest, LostPeersAreUnavailableBadArgumentsInvalidRestInternal) {
  EXPECT_EQ(CodeFor(ncclSystemError), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeFor(ncclRemoteError), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeFor(ncclInvalidArgument), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeFor(ncclUnhandledCudaError), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeFor(ncclInternalError), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeFor(ncclInvalidUsage), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeFor(ncclInProgress), absl::StatusCode::kInternal);
}

TEST(NcclStatusTest, AcceptedMeansDoneOrStillRunning) {
  EXPECT_TRUE(Accepted(ncclSuccess));
  EXPECT_TRUE(Accepted(ncclInProgress));
  EXPECT_FALSE(Accepted(ncclSystemError));
}

// Within kSpinFor a wait only yields; past it, it sleeps at least the
// pauses it promises (a lower bound: a loaded machine may sleep longer).
// One yield can outlast the whole window when the machine is loaded (the
// thread is not run again within kSpinFor), so the window is tried on fresh
// Backoffs until one sees this thread run in it more than once.
TEST(BackoffTest, YieldsFirstThenSleepsGrowingPausesUpToTheLongest) {
  int spins = 0;
  for (int attempt = 0; attempt < 50 && spins <= 1; ++attempt) {
    Backoff fresh;
    const Clock::time_point start = Clock::now();
    spins = 0;
    while (Clock::now() - start < absl::ToChronoNanoseconds(kSpinFor)) {
      fresh.Pause();
      ++spins;
    }
  }
  EXPECT_GT(spins, 1);
  Backoff backoff;
  const Clock::time_point start = Clock::now();
  while (Clock::now() - start < absl::ToChronoNanoseconds(kSpinFor)) {
    backoff.Pause();
  }
  const Clock::time_point sleeping = Clock::now();
  constexpr int kPauses = 8;
  for (int i = 0; i < kPauses; ++i) backoff.Pause();
  absl::Duration promised;
  absl::Duration pause = kFirstPause;
  for (int i = 0; i < kPauses; ++i) {
    promised += pause;
    pause = std::min(pause * 2, kLongestPause);
  }
  EXPECT_GE(absl::FromChrono(Clock::now() - sleeping), promised);
}

}  // namespace
}  // namespace nccl
}  // namespace transport
}  // namespace muonps
