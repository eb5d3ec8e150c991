// TransferMessages against hand-written frames over real loopback sockets:
// a garbled or oversized frame fails that transfer precisely and leaves the
// receiving buffer untouched, a frame whose tag does not verify (altered,
// injected, or tagged for another connection) is refused naming the peer,
// the receiver goes on exchanging with another rank, and a peer trickling
// bytes cannot stretch a call past call_timeout.
#include "transport/message_transfer.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/socket_io.h"
#include "transport/wire_format.h"

namespace muonps {
namespace transport {
namespace {

using ::testing::AllOf;
using ::testing::Each;
using ::testing::HasSubstr;

constexpr size_t kPayload = 64;
constexpr unsigned char kUntouched = 0xAB;

Deadline Soon() { return DeadlineAfter(absl::Seconds(5)); }

// The key of the frames rank `from` sends to rank `to` in these tests.
FrameKey KeyOf(int from, int to) {
  FrameKey key = {};
  key[0] = static_cast<unsigned char>(from);
  key[1] = static_cast<unsigned char>(to);
  key[31] = 0x5A;
  return key;
}

// Rank 0 of three: `sockets` are its ends of connections to ranks 1 and 2,
// `far[peer]` the other ends, which the test writes by hand.
class MessageTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Socket> listener = ListenOn("127.0.0.1", 0);
    ASSERT_TRUE(listener.ok()) << listener.status();
    absl::StatusOr<int> port = LocalPort(*listener);
    ASSERT_TRUE(port.ok());
    sockets_.resize(3);
    far_.resize(3);
    for (int peer = 1; peer < 3; ++peer) {
      absl::StatusOr<Socket> far = ConnectOnce({"127.0.0.1", *port}, Soon());
      ASSERT_TRUE(far.ok()) << far.status();
      absl::StatusOr<Socket> near = AcceptBefore(*listener, Soon());
      ASSERT_TRUE(near.ok()) << near.status();
      far_[peer] = *std::move(far);
      sockets_[peer].socket = *std::move(near);
      sockets_[peer].keys = {KeyOf(0, peer), KeyOf(peer, 0)};
    }
  }

  // A frame from `peer`, tagged with `key` (by default its own key
  // towards rank 0).
  void SendFrame(int peer, const FrameHeader& header, const void* payload,
                 size_t bytes, const FrameKey* key = nullptr) {
    unsigned char encoded[kFrameHeaderBytes];
    EncodeFrameHeader(header, encoded);
    ASSERT_TRUE(
        WriteAllBefore(far_[peer], encoded, sizeof(encoded), Soon()).ok());
    ASSERT_TRUE(WriteAllBefore(far_[peer], payload, bytes, Soon()).ok());
    const FrameKey own = KeyOf(peer, 0);
    absl::StatusOr<FrameTag> tag =
        TagFrame(key != nullptr ? *key : own, header, payload, bytes);
    ASSERT_TRUE(tag.ok()) << tag.status();
    ASSERT_TRUE(
        WriteAllBefore(far_[peer], tag->data(), tag->size(), Soon()).ok());
  }

  absl::Status ReceiveFrom(int peer, std::vector<unsigned char>& buffer,
                           absl::Duration call_timeout = absl::Seconds(5)) {
    IncomingMessage message;
    message.peer = peer;
    message.expected = {MessageKind::kPointToPoint, 0, buffer.size()};
    message.data = buffer.data();
    return TransferMessages(sockets_, {}, {message}, absl::Seconds(5),
                            call_timeout);
  }

  // Rank 2 exchanges a message each way with rank 0, whole.
  void ExpectExchangeWithRank2() {
    const std::vector<unsigned char> from2(kPayload, 0x22);
    SendFrame(2, {MessageKind::kPointToPoint, 0, kPayload}, from2.data(),
              from2.size());
    std::vector<unsigned char> in(kPayload, 0);
    const std::vector<unsigned char> to2(kPayload, 0x02);
    IncomingMessage incoming;
    incoming.peer = 2;
    incoming.expected = {MessageKind::kPointToPoint, 0, kPayload};
    incoming.data = in.data();
    OutgoingMessage outgoing;
    outgoing.peer = 2;
    outgoing.header = {MessageKind::kPointToPoint, 0, kPayload};
    outgoing.data = to2.data();
    const absl::Status status = TransferMessages(
        sockets_, {outgoing}, {incoming}, absl::Seconds(5), absl::Seconds(5));
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(in, from2);
    unsigned char header[kFrameHeaderBytes];
    ASSERT_TRUE(ReadAllBefore(far_[2], header, sizeof(header), Soon()).ok());
    FrameHeader decoded;
    ASSERT_TRUE(DecodeFrameHeader(header, &decoded));
    EXPECT_EQ(decoded.bytes, kPayload);
    std::vector<unsigned char> out(kPayload);
    ASSERT_TRUE(ReadAllBefore(far_[2], out.data(), out.size(), Soon()).ok());
    EXPECT_EQ(out, to2);
    FrameTag tag;
    ASSERT_TRUE(ReadAllBefore(far_[2], tag.data(), tag.size(), Soon()).ok());
    EXPECT_TRUE(
        FrameTagMatches(KeyOf(0, 2), decoded, out.data(), out.size(), tag));
  }

  std::vector<Connection> sockets_;
  std::vector<Socket> far_;
};

TEST_F(MessageTransferTest, GarbledHeaderFailsAndLeavesTheBufferUntouched) {
  // 24 bytes that are no frame header, then what would fill the buffer.
  const std::string junk(kFrameHeaderBytes + kPayload, 'Z');
  ASSERT_TRUE(WriteAllBefore(far_[1], junk.data(), junk.size(), Soon()).ok());
  std::vector<unsigned char> buffer(kPayload, kUntouched);
  const absl::Status status = ReceiveFrom(1, buffer);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("peer rank 1"),
                                      HasSubstr("not a muonps frame header")));
  EXPECT_THAT(buffer, Each(kUntouched));
  ExpectExchangeWithRank2();
}

TEST_F(MessageTransferTest, OversizedFrameFailsAndLeavesTheBufferUntouched) {
  const std::vector<unsigned char> big(1 << 20, 0x5A);
  std::thread sender([&] {
    unsigned char encoded[kFrameHeaderBytes];
    EncodeFrameHeader({MessageKind::kPointToPoint, 0, big.size()}, encoded);
    ASSERT_TRUE(WriteAllBefore(far_[1], encoded, sizeof(encoded), Soon()).ok());
    // The receiver refuses the frame from its header and never reads the
    // payload: unless the kernel buffers all of it, Close below ends this
    // write with an error, which is expected.
    (void)WriteAllBefore(far_[1], big.data(), big.size(), Soon());
  });
  std::vector<unsigned char> buffer(kPayload, kUntouched);
  const absl::Status status = ReceiveFrom(1, buffer);
  far_[1].Close();  // Ends the sender's write if the kernel held it up.
  sender.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("peer rank 1 sent send/recv message #0 of "
                              "1048576 bytes"),
                    HasSubstr("expected send/recv message #0 of 64 bytes"),
                    HasSubstr("length (larger) differs")));
  EXPECT_THAT(buffer, Each(kUntouched));
  ExpectExchangeWithRank2();
}

TEST_F(MessageTransferTest, WrongSequenceNumberFailsBeforeAnyPayloadByte) {
  const std::vector<unsigned char> payload(kPayload, 0x11);
  SendFrame(1, {MessageKind::kPointToPoint, 7, kPayload}, payload.data(),
            payload.size());
  std::vector<unsigned char> buffer(kPayload, kUntouched);
  const absl::Status status = ReceiveFrom(1, buffer);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("peer rank 1"),
                                      HasSubstr("sequence number differs")));
  EXPECT_THAT(buffer, Each(kUntouched));
  ExpectExchangeWithRank2();
}

TEST_F(MessageTransferTest, AFrameWhoseTagFailsIsRefusedNamingThePeer) {
  const std::vector<unsigned char> payload(kPayload, 0x11);
  const FrameHeader header = {MessageKind::kPointToPoint, 0, kPayload};
  // Altered on the way: the tag was made over other bytes.
  std::vector<unsigned char> other = payload;
  other[5] ^= 1;
  unsigned char encoded[kFrameHeaderBytes];
  EncodeFrameHeader(header, encoded);
  ASSERT_TRUE(WriteAllBefore(far_[1], encoded, sizeof(encoded), Soon()).ok());
  ASSERT_TRUE(
      WriteAllBefore(far_[1], payload.data(), payload.size(), Soon()).ok());
  absl::StatusOr<FrameTag> tag =
      TagFrame(KeyOf(1, 0), header, other.data(), other.size());
  ASSERT_TRUE(tag.ok());
  ASSERT_TRUE(WriteAllBefore(far_[1], tag->data(), tag->size(), Soon()).ok());
  std::vector<unsigned char> buffer(kPayload, kUntouched);
  absl::Status status = ReceiveFrom(1, buffer);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("peer rank 1"), HasSubstr("message #0"),
                    HasSubstr("failed its authentication")));
  ExpectExchangeWithRank2();
}

TEST_F(MessageTransferTest, AFrameTaggedForAnotherConnectionIsRefused) {
  // Recorded on rank 2's connection (its key) and injected on rank 1's.
  const std::vector<unsigned char> payload(kPayload, 0x11);
  const FrameKey rank2 = KeyOf(2, 0);
  SendFrame(1, {MessageKind::kPointToPoint, 0, kPayload}, payload.data(),
            payload.size(), &rank2);
  std::vector<unsigned char> buffer(kPayload, kUntouched);
  const absl::Status status = ReceiveFrom(1, buffer);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_THAT(status.message(), HasSubstr("peer rank 1"));
  ExpectExchangeWithRank2();
}

TEST_F(MessageTransferTest, AnAuthenticFrameArrivesWhole) {
  const std::vector<unsigned char> payload(kPayload, 0x11);
  SendFrame(1, {MessageKind::kPointToPoint, 0, kPayload}, payload.data(),
            payload.size());
  std::vector<unsigned char> buffer(kPayload, kUntouched);
  const absl::Status status = ReceiveFrom(1, buffer);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(buffer, payload);
}

TEST_F(MessageTransferTest, TricklingPeerCannotExtendACallPastCallTimeout) {
  std::atomic<bool> stop{false};
  std::thread trickler([&] {
    unsigned char header[kFrameHeaderBytes];
    EncodeFrameHeader({MessageKind::kPointToPoint, 0, kPayload}, header);
    WriteAllBefore(far_[1], header, sizeof(header), Soon()).IgnoreError();
    const unsigned char byte = 1;
    // One byte every 20 ms: never idle for io_timeout (5 s).
    for (size_t i = 0; i < kPayload - 1 && !stop.load(); ++i) {
      WriteAllBefore(far_[1], &byte, 1, Soon()).IgnoreError();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::vector<unsigned char> buffer(kPayload, 0);
  const auto start = std::chrono::steady_clock::now();
  const absl::Status status =
      ReceiveFrom(1, buffer, /*call_timeout=*/absl::Milliseconds(300));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  stop.store(true);
  trickler.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("peer rank 1"), HasSubstr("call_timeout")));
  EXPECT_GE(seconds, 0.28);
  EXPECT_LT(seconds, 1.0);
}

}  // namespace
}  // namespace transport
}  // namespace muonps
