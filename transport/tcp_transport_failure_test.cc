// Failure tests of TcpTransport: peers that vanish, stall, disagree on the
// session or issue mismatched calls fail fast with a status naming the peer;
// nothing hangs.
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/loopback_ranks.h"
#include "transport/tcp_transport.h"

namespace muonps {
namespace transport {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TcpOptions ShortTimeouts() {
  TcpOptions options = LoopbackOptions();
  options.connect_timeout = absl::Seconds(1);
  options.io_timeout = absl::Seconds(1);
  return options;
}

std::vector<std::unique_ptr<TcpTransport>> World(int world) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> ranks =
      ConnectLoopbackWorld(world, /*session=*/5, ShortTimeouts());
  EXPECT_TRUE(ranks.ok()) << ranks.status();
  return ranks.ok() ? *std::move(ranks)
                    : std::vector<std::unique_ptr<TcpTransport>>();
}

TEST(TcpTransportFailureTest, PeerThatClosesFailsPendingRecvsUnavailable) {
  std::vector<std::unique_ptr<TcpTransport>> ranks = World(3);
  ASSERT_EQ(ranks.size(), 3u);
  RunOnEveryRank(3, [&](int rank) {
    if (rank == 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ranks[2].reset();  // Closes its connections mid-call of the others.
      return;
    }
    float buffer[16];
    const Clock::time_point start = Clock::now();
    const absl::Status status =
        ranks[rank]->Recv(buffer, 16, DType::kFloat32, 2, kHostStream);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(), HasSubstr("peer rank 2"));
    EXPECT_LT(SecondsSince(start), 0.9) << "must not wait for io_timeout";
    // Broken: even a call between the two healthy ranks fails at once.
    const absl::Status after =
        ranks[rank]->Send(buffer, 1, DType::kFloat32, 1 - rank, kHostStream);
    EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
    EXPECT_THAT(after.message(), HasSubstr("peer rank 2"));
  });
}

TEST(TcpTransportFailureTest, PeerThatNeverSendsGivesDeadlineExceeded) {
  std::vector<std::unique_ptr<TcpTransport>> ranks = World(2);
  ASSERT_EQ(ranks.size(), 2u);
  float buffer[256];
  const Clock::time_point start = Clock::now();
  const absl::Status status =
      ranks[0]->Recv(buffer, 256, DType::kFloat32, 1, kHostStream);
  const double seconds = SecondsSince(start);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("peer rank 1"), HasSubstr("io_timeout")));
  EXPECT_GE(seconds, 0.95);
  EXPECT_LT(seconds, 2.0);
  EXPECT_EQ(ranks[0]->Recv(buffer, 256, DType::kFloat32, 1, kHostStream).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(TcpTransportFailureTest, PeerThatNeverReceivesGivesDeadlineExceeded) {
  std::vector<std::unique_ptr<TcpTransport>> ranks = World(2);
  ASSERT_EQ(ranks.size(), 2u);
  // Far beyond what the socket buffers of both ends can hold: 64 MiB.
  const std::vector<float> data(16 << 20, 1.0f);
  const Clock::time_point start = Clock::now();
  const absl::Status status =
      ranks[1]->Send(data.data(), data.size(), DType::kFloat32, 0, kHostStream);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(), HasSubstr("peer rank 0"));
  EXPECT_LT(SecondsSince(start), 2.0);
}

// Why groups exist: both ranks send 32 MiB before receiving, call by call.
// Neither send fits the socket buffers, so both stall until io_timeout (the
// grouped version in tcp_transport_world_test completes).
TEST(TcpTransportFailureTest, UngroupedCrossingSendsOf32MiBTimeOutNotHang) {
  std::vector<std::unique_ptr<TcpTransport>> ranks = World(2);
  ASSERT_EQ(ranks.size(), 2u);
  const std::vector<float> data(8 << 20, 1.0f);  // 32 MiB
  RunOnEveryRank(2, [&](int rank) {
    const Clock::time_point start = Clock::now();
    const absl::Status status = ranks[rank]->Send(
        data.data(), data.size(), DType::kFloat32, 1 - rank, kHostStream);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_LT(SecondsSince(start), 2.0);
  });
}

TEST(TcpTransportFailureTest, MismatchedSessionsAreRefusedAtTheHandshake) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(2);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  const Clock::time_point start = Clock::now();
  std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> results =
      ConnectEveryRank(*listeners, {7, 8}, ShortTimeouts());
  EXPECT_LT(SecondsSince(start), 2.0);
  for (int rank = 0; rank < 2; ++rank) {
    const absl::Status& status = results[rank].status();
    // Peers on two plans' sessions: a retry once the plan reached both.
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("session mismatch"), HasSubstr("session 7"),
                      HasSubstr("session 8"),
                      HasSubstr(absl::StrCat("peer rank ", 1 - rank))));
  }
}

TEST(TcpTransportFailureTest, StaleConnectionFromAnOlderSessionIsNotReused) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(2);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  const std::vector<std::string> addresses = AddressesOf(*listeners);
  // Rank 1 of session 1 connects and says hello while rank 0 is not yet
  // accepting, then gives up: its hellos wait in rank 0's accept queue.
  TcpOptions impatient = ShortTimeouts();
  impatient.connect_timeout = absl::Milliseconds(300);
  absl::StatusOr<std::unique_ptr<TcpTransport>> stale = TcpTransport::Connect(
      (*listeners)[1].get(), 1, addresses, /*session=*/1, impatient);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kDeadlineExceeded)
      << stale.status();
  // Session 2 must skip those and pair with the real rank 1.
  std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> fresh =
      ConnectEveryRank(*listeners, {2, 2}, ShortTimeouts());
  ASSERT_TRUE(fresh[0].ok()) << fresh[0].status();
  ASSERT_TRUE(fresh[1].ok()) << fresh[1].status();
  RunOnEveryRank(2, [&](int rank) {
    int value = rank == 1 ? 12345 : 0;
    ASSERT_TRUE((*fresh[rank])
                    ->Broadcast(&value, 1, DType::kFloat32, 1, kHostStream)
                    .ok());
    EXPECT_EQ(value, 12345);
  });
}

TEST(TcpTransportFailureTest, RetryOnTheSameSessionSkipsAbandonedAttempts) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(2);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  // Rank 1 tries session 3 alone and gives up; its hellos stay queued.
  TcpOptions impatient = ShortTimeouts();
  impatient.connect_timeout = absl::Milliseconds(300);
  EXPECT_FALSE(TcpTransport::Connect((*listeners)[1].get(), 1,
                                     AddressesOf(*listeners), 3, impatient)
                   .ok());
  // Same session again: the queued hellos match it but are never confirmed,
  // so rank 0 must not take one for rank 1's live connection.
  std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> retry =
      ConnectEveryRank(*listeners, {3, 3}, ShortTimeouts());
  ASSERT_TRUE(retry[0].ok()) << retry[0].status();
  ASSERT_TRUE(retry[1].ok()) << retry[1].status();
  RunOnEveryRank(2, [&](int rank) {
    int value = rank == 0 ? 777 : 0;
    ASSERT_TRUE((*retry[rank])
                    ->Broadcast(&value, 1, DType::kFloat32, 0, kHostStream)
                    .ok());
    EXPECT_EQ(value, 777);
  });
}

TEST(TcpTransportFailureTest, MismatchedMessageSizesGiveInternalNamingPeer) {
  std::vector<std::unique_ptr<TcpTransport>> ranks = World(2);
  ASSERT_EQ(ranks.size(), 2u);
  std::vector<float> buffer(50, 1.0f);  // 200 bytes
  absl::Status received;
  RunOnEveryRank(2, [&](int rank) {
    if (rank == 0) {
      EXPECT_TRUE(ranks[0]
                      ->Send(buffer.data(), 50, DType::kFloat32, 1, kHostStream)
                      .ok());
    } else {
      std::vector<float> small(25);  // 100 bytes
      received = ranks[1]->Recv(small.data(), small.size(), DType::kFloat32, 0,
                                kHostStream);
    }
  });
  EXPECT_EQ(received.code(), absl::StatusCode::kInternal) << received;
  EXPECT_THAT(received.message(),
              AllOf(HasSubstr("peer rank 0"), HasSubstr("of 200 bytes"),
                    HasSubstr("expected send/recv message #0 of 100 bytes")));
}

TEST(TcpTransportFailureTest, MismatchedCallKindsGiveInternalNamingPeer) {
  std::vector<std::unique_ptr<TcpTransport>> ranks = World(2);
  ASSERT_EQ(ranks.size(), 2u);
  absl::Status received;
  RunOnEveryRank(2, [&](int rank) {
    float data[16] = {};
    if (rank == 0) {
      EXPECT_TRUE(
          ranks[0]->Broadcast(data, 16, DType::kFloat32, 0, kHostStream).ok());
    } else {
      received = ranks[1]->Recv(data, 16, DType::kFloat32, 0, kHostStream);
    }
  });
  EXPECT_EQ(received.code(), absl::StatusCode::kInternal) << received;
  EXPECT_THAT(received.message(), AllOf(HasSubstr("peer rank 0 sent broadcast"),
                                        HasSubstr("expected send/recv")));
}

TEST(TcpTransportFailureTest, InvalidCallsAreRejectedAndBreakTheTransport) {
  std::vector<std::unique_ptr<TcpTransport>> ranks = World(1);
  ASSERT_EQ(ranks.size(), 1u);
  float value = 0;
  EXPECT_EQ(ranks[0]->Send(&value, 1, DType::kFloat32, 0, kHostStream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ranks[0]->Broadcast(&value, 1, DType::kFloat32, 0, kHostStream).code(),
      absl::StatusCode::kFailedPrecondition);

  std::vector<std::unique_ptr<TcpTransport>> fresh = World(1);
  ASSERT_EQ(fresh.size(), 1u);
  EXPECT_EQ(fresh[0]->GroupEnd().code(), absl::StatusCode::kFailedPrecondition);

  // Counts are elements: one whose bytes overflow a size_t is refused.
  std::vector<std::unique_ptr<TcpTransport>> huge = World(1);
  ASSERT_EQ(huge.size(), 1u);
  const absl::Status too_large =
      huge[0]->Broadcast(&value, std::numeric_limits<size_t>::max(),
                         DType::kBFloat16, 0, kHostStream);
  EXPECT_EQ(too_large.code(), absl::StatusCode::kInvalidArgument) << too_large;
  EXPECT_THAT(too_large.message(), HasSubstr("bf16 is too large"));
}

TEST(TcpTransportFailureTest, ConnectRejectsBadArguments) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(1);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  TcpListener* listener = (*listeners)[0].get();
  const std::vector<std::string> one = {listener->address()};
  const TcpOptions options = LoopbackOptions();
  EXPECT_EQ(TcpTransport::Connect(nullptr, 0, one, 1, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpTransport::Connect(listener, 1, one, 1, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status bad_address =
      TcpTransport::Connect(listener, 0, {"no-port-here"}, 1, options).status();
  EXPECT_EQ(bad_address.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_address.message(), HasSubstr("peer_addresses[0]"));
}

TEST(TcpTransportFailureTest, ConnectRequiresADataPlaneSecretOf16Bytes) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(1);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  TcpListener* listener = (*listeners)[0].get();
  const std::vector<std::string> one = {listener->address()};
  TcpOptions options;  // No secret.
  const absl::Status missing =
      TcpTransport::Connect(listener, 0, one, 1, options).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
  EXPECT_THAT(
      missing.message(),
      AllOf(HasSubstr("TcpOptions.data_plane_secret"), HasSubstr("empty")));
  options.data_plane_secret = "fifteen-bytes!!";
  ASSERT_EQ(options.data_plane_secret.size(), 15u);
  const absl::Status short_secret =
      TcpTransport::Connect(listener, 0, one, 1, options).status();
  EXPECT_EQ(short_secret.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_secret.message(),
              AllOf(HasSubstr("TcpOptions.data_plane_secret"),
                    HasSubstr("15 bytes"), HasSubstr("at least 16")));
  EXPECT_THAT(std::string(short_secret.message()),
              ::testing::Not(HasSubstr("fifteen")));
  options.data_plane_secret = "sixteen-bytes!!!";
  EXPECT_TRUE(TcpTransport::Connect(listener, 0, one, 1, options).ok());
}

}  // namespace
}  // namespace transport
}  // namespace muonps
