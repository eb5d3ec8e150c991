// TcpTransport beside the data path, ranks as threads of one process over
// loopback TCP: ReduceSum refuses an order that is no permutation, Abort
// from another thread ends a blocked Recv and every later call, and
// AwaitFrom waits for the next message without taking it.
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/loopback_ranks.h"
#include "transport/tcp_transport.h"

namespace muonps {
namespace transport {
namespace {

TEST(TcpTransportTest, ReduceSumRefusesAnOrderThatIsNotAPermutation) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> ranks =
      ConnectLoopbackWorld(1, /*session=*/43, LoopbackOptions());
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  float x = 1;
  const std::vector<int> twice = {0, 0};
  const absl::Status status =
      (*ranks)[0]->ReduceSum(&x, &x, 1, 0, twice, kHostStream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr("order"));
}

TEST(TcpTransportTest, AbortFromAnotherThreadEndsABlockedRecvAndLaterCalls) {
  TcpOptions options = LoopbackOptions();
  options.io_timeout = absl::Seconds(60);  // Abort, not the timeout, ends it.
  absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> ranks =
      ConnectLoopbackWorld(2, /*session=*/44, options);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  TcpTransport& waiting = *(*ranks)[0];
  const absl::Time start = absl::Now();
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    waiting.Abort(absl::UnavailableError("peer w1 lost its lease"));
  });
  float x = 0;
  const absl::Status status =
      waiting.Recv(&x, 1, DType::kFloat32, 1, kHostStream);
  aborter.join();
  EXPECT_FALSE(status.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  const absl::Status later =
      waiting.Send(&x, 1, DType::kFloat32, 1, kHostStream);
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(later.message()),
              ::testing::HasSubstr("peer w1 lost its lease"));
}

// What a worker with no trainer waits on between steps: nothing yet is a
// timeout that leaves the transport usable; a message makes it return
// without consuming it; Abort wakes it.
TEST(TcpTransportTest, AwaitFromWaitsForTheNextMessageWithoutTakingIt) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> ranks =
      ConnectLoopbackWorld(2, /*session=*/45, LoopbackOptions());
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  TcpTransport& follower = *(*ranks)[1];
  const absl::Status idle =
      follower.AwaitFrom(0, 1, DType::kFloat32, absl::Milliseconds(50));
  EXPECT_EQ(idle.code(), absl::StatusCode::kDeadlineExceeded) << idle;
  float sent = 2.5f, got = 0;
  ASSERT_TRUE(
      (*ranks)[0]->Send(&sent, 1, DType::kFloat32, 1, kHostStream).ok());
  EXPECT_TRUE(
      follower.AwaitFrom(0, 1, DType::kFloat32, absl::Seconds(10)).ok());
  ASSERT_TRUE(follower.Recv(&got, 1, DType::kFloat32, 0, kHostStream).ok());
  EXPECT_EQ(got, 2.5f);
  EXPECT_EQ(follower.AwaitFrom(1, 1, DType::kFloat32, absl::Seconds(1)).code(),
            absl::StatusCode::kInvalidArgument);  // itself
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    follower.Abort(absl::CancelledError("plan version 2 replaced it"));
  });
  const absl::Time start = absl::Now();
  const absl::Status woken =
      follower.AwaitFrom(0, 1, DType::kFloat32, absl::Seconds(60));
  aborter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_THAT(std::string(woken.message()),
              ::testing::HasSubstr("plan version 2 replaced it"));
}

}  // namespace
}  // namespace transport
}  // namespace muonps
