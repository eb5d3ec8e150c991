// The data-plane handshake over real loopback sockets: a process without
// the job's secret cannot take a rank, a recorded handshake cannot be
// replayed, and idle connections to a listener do not hold up the mesh.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/loopback_ranks.h"
#include "transport/membership_proof.h"
#include "transport/socket_io.h"
#include "transport/tcp_transport.h"
#include "transport/wire_format.h"

namespace muonps {
namespace transport {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using Clock = std::chrono::steady_clock;

constexpr uint64_t kSession = 9;
constexpr char kWrongSecret[] = "not this job's secret, 32 bytes.";

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Deadline Soon() { return DeadlineAfter(absl::Seconds(5)); }

Socket ConnectTo(const TcpListener& listener) {
  absl::StatusOr<Socket> socket =
      ConnectOnce({"127.0.0.1", listener.port()}, Soon());
  EXPECT_TRUE(socket.ok()) << socket.status();
  return socket.ok() ? *std::move(socket) : Socket();
}

void Write(const Socket& socket, const unsigned char* bytes) {
  EXPECT_TRUE(WriteAllBefore(socket, bytes, kHandshakeBytes, Soon()).ok());
}

// True once the peer closed `socket` (it refused what it was sent).
bool ClosedByPeer(const Socket& socket) {
  unsigned char byte;
  return absl::IsUnavailable(ReadAllBefore(socket, &byte, 1, Soon()));
}

// The connecting side of the handshake done by hand, as rank 1 of 2 on
// kSession, proving with `secret`. Keeps the bytes it sent.
struct HandRolledRank1 {
  Socket socket;
  unsigned char hello[kHandshakeBytes] = {};
  unsigned char confirmation[kHandshakeBytes] = {};
  Handshake acceptance;

  // Sends the hello and reads rank 0's acceptance.
  void SayHello(const TcpListener& rank0) {
    socket = ConnectTo(rank0);
    Handshake h;
    h.session = kSession;
    h.from_rank = 1;
    h.to_rank = 0;
    h.world_size = 2;
    h.nonce = *FreshNonce();
    EncodeHandshake(h, hello);
    Write(socket, hello);
    unsigned char reply[kHandshakeBytes];
    ASSERT_TRUE(ReadAllBefore(socket, reply, sizeof(reply), Soon()).ok());
    ASSERT_TRUE(DecodeHandshake(reply, &acceptance));
    ASSERT_EQ(acceptance.verdict, HandshakeVerdict::kAccepted);
  }

  void Confirm(absl::string_view secret) {
    Handshake h;
    ASSERT_TRUE(DecodeHandshake(hello, &h));
    HandshakeTranscript t;
    t.session = kSession;
    t.connecting_rank = 1;
    t.accepting_rank = 0;
    t.world_size = 2;
    t.connecting_nonce = h.nonce;
    t.accepting_nonce = acceptance.nonce;
    h.verdict = HandshakeVerdict::kConfirmed;
    h.nonce = {};
    h.proof = *ProveMembership(secret, ProvingSide::kConnectingRank, t);
    EncodeHandshake(h, confirmation);
    Write(socket, confirmation);
  }
};

// Rank 0 of a world of two, connecting in a thread.
class Rank0 {
 public:
  Rank0(TcpListener* listener, std::vector<std::string> addresses,
        TcpOptions options)
      : thread_([=] {
          result_ =
              TcpTransport::Connect(listener, 0, addresses, kSession, options);
        }) {}
  absl::StatusOr<std::unique_ptr<TcpTransport>>& Join() {
    thread_.join();
    return result_;
  }

 private:
  absl::StatusOr<std::unique_ptr<TcpTransport>> result_ =
      absl::UnknownError("not run");
  std::thread thread_;
};

absl::StatusOr<std::unique_ptr<TcpTransport>> RealRank1(
    const std::vector<std::unique_ptr<TcpListener>>& listeners) {
  return TcpTransport::Connect(listeners[1].get(), 1, AddressesOf(listeners),
                               kSession, LoopbackOptions());
}

// An int travels as one fp32 element (its bytes, unconverted).
void ExpectBroadcastWorks(TcpTransport& rank0, TcpTransport& rank1) {
  static_assert(sizeof(int) == sizeof(float), "an int is one float");
  int sent = 4242;
  int got = 0;
  std::thread receiver([&] {
    EXPECT_TRUE(rank1.Broadcast(&got, 1, DType::kFloat32, 0, kHostStream).ok());
  });
  EXPECT_TRUE(rank0.Broadcast(&sent, 1, DType::kFloat32, 0, kHostStream).ok());
  receiver.join();
  EXPECT_EQ(got, 4242);
}

TEST(TcpMeshTest, HelloWithTheWrongSecretIsRefusedAndTheRealPeerConnects) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(2);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  Rank0 rank0((*listeners)[0].get(), AddressesOf(*listeners),
              LoopbackOptions());
  // A valid-looking hello for {session, rank 1, world 2}, then a
  // confirmation keyed by another secret: rank 0 hangs up on it.
  HandRolledRank1 impostor;
  impostor.SayHello(*(*listeners)[0]);
  impostor.Confirm(kWrongSecret);
  EXPECT_TRUE(ClosedByPeer(impostor.socket));

  absl::StatusOr<std::unique_ptr<TcpTransport>> rank1 = RealRank1(*listeners);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  absl::StatusOr<std::unique_ptr<TcpTransport>>& accepted = rank0.Join();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ExpectBroadcastWorks(**accepted, **rank1);
}

TEST(TcpMeshTest, ConnectingWithTheWrongSecretFailsTheMembershipProof) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(2);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  TcpOptions impostor_options = LoopbackOptions();
  impostor_options.data_plane_secret = kWrongSecret;
  impostor_options.connect_timeout = absl::Milliseconds(500);
  TcpOptions rank0_options = LoopbackOptions();
  rank0_options.connect_timeout = absl::Seconds(3);
  Rank0 rank0((*listeners)[0].get(), AddressesOf(*listeners), rank0_options);
  // The impostor checks rank 0's proof first and gives up on it.
  const absl::Status impostor =
      TcpTransport::Connect((*listeners)[1].get(), 1, AddressesOf(*listeners),
                            kSession, impostor_options)
          .status();
  EXPECT_EQ(impostor.code(), absl::StatusCode::kFailedPrecondition) << impostor;
  EXPECT_THAT(impostor.message(),
              AllOf(HasSubstr("peer rank 0"),
                    HasSubstr("failed the job's membership proof")));
  EXPECT_THAT(std::string(impostor.message()),
              ::testing::Not(HasSubstr(kWrongSecret)));

  absl::StatusOr<std::unique_ptr<TcpTransport>> rank1 = RealRank1(*listeners);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  absl::StatusOr<std::unique_ptr<TcpTransport>>& accepted = rank0.Join();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ExpectBroadcastWorks(**accepted, **rank1);
}

TEST(TcpMeshTest, RecordedHelloAndConfirmationReplayedAreRefused) {
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(2);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  // A genuine handshake, recorded.
  HandRolledRank1 genuine;
  {
    Rank0 rank0((*listeners)[0].get(), AddressesOf(*listeners),
                LoopbackOptions());
    genuine.SayHello(*(*listeners)[0]);
    genuine.Confirm(kLoopbackSecret);
    absl::StatusOr<std::unique_ptr<TcpTransport>>& first = rank0.Join();
    ASSERT_TRUE(first.ok()) << first.status();
  }
  // Rank 0 forms the same session again; the recording is replayed on a
  // new connection. Rank 0's nonce is new, so the old proof fails.
  Rank0 rank0((*listeners)[0].get(), AddressesOf(*listeners),
              LoopbackOptions());
  Socket replay = ConnectTo(*(*listeners)[0]);
  Write(replay, genuine.hello);
  unsigned char reply[kHandshakeBytes];
  ASSERT_TRUE(ReadAllBefore(replay, reply, sizeof(reply), Soon()).ok());
  Handshake acceptance;
  ASSERT_TRUE(DecodeHandshake(reply, &acceptance));
  EXPECT_NE(acceptance.nonce, genuine.acceptance.nonce);
  Write(replay, genuine.confirmation);
  EXPECT_TRUE(ClosedByPeer(replay));

  absl::StatusOr<std::unique_ptr<TcpTransport>> rank1 = RealRank1(*listeners);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  absl::StatusOr<std::unique_ptr<TcpTransport>>& accepted = rank0.Join();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ExpectBroadcastWorks(**accepted, **rank1);
}

TEST(TcpMeshTest, IdleSlowAndGarbageConnectionsDoNotDelayTheMesh) {
  constexpr int kWorld = 3;
  absl::StatusOr<std::vector<std::unique_ptr<TcpListener>>> listeners =
      BindLoopbackListeners(kWorld);
  ASSERT_TRUE(listeners.ok()) << listeners.status();
  // Before the mesh forms, each accepting rank's listener holds connections
  // that say nothing, half a hello, or junk.
  std::vector<Socket> strays;
  for (int rank = 0; rank < kWorld - 1; ++rank) {
    for (int i = 0; i < 4; ++i) {
      strays.push_back(ConnectTo(*(*listeners)[rank]));
    }
    Socket slow = ConnectTo(*(*listeners)[rank]);
    unsigned char half[kHandshakeBytes / 2] = {'M', 'P', 'S', 'H'};
    ASSERT_TRUE(WriteAllBefore(slow, half, sizeof(half), Soon()).ok());
    strays.push_back(std::move(slow));
    Socket junk = ConnectTo(*(*listeners)[rank]);
    const std::string text(kHandshakeBytes, 'G');
    ASSERT_TRUE(WriteAllBefore(junk, text.data(), text.size(), Soon()).ok());
    strays.push_back(std::move(junk));
  }
  TcpOptions options = LoopbackOptions();
  options.io_timeout = absl::Seconds(5);  // Each stray's handshake_timeout.
  options.connect_timeout = absl::Seconds(30);
  const Clock::time_point start = Clock::now();
  std::vector<absl::StatusOr<std::unique_ptr<TcpTransport>>> ranks =
      ConnectEveryRank(*listeners, std::vector<uint64_t>(kWorld, kSession),
                       options);
  // Far below one handshake_timeout, let alone one per stray.
  EXPECT_LT(SecondsSince(start), 2.0);
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(ranks[rank].ok()) << ranks[rank].status();
  }
  RunOnEveryRank(kWorld, [&](int rank) {
    int value = rank == 2 ? 99 : 0;
    EXPECT_TRUE((*ranks[rank])
                    ->Broadcast(&value, 1, DType::kFloat32, 2, kHostStream)
                    .ok());
    EXPECT_EQ(value, 99);
  });
}

}  // namespace
}  // namespace transport
}  // namespace muonps
