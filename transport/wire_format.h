// The bytes the TCP transport puts on the wire: the handshake that opens a
// connection and the header in front of every message. All integers are
// little-endian and fixed-width, so ranks built by different compilers
// agree. Pure functions; thread-safe.
#ifndef MUONPS_TRANSPORT_WIRE_FORMAT_H_
#define MUONPS_TRANSPORT_WIRE_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace muonps {
namespace transport {

// Bumped whenever either layout below changes; peers on different versions
// refuse each other at the handshake. Version 2 added the nonce and the
// membership proof (membership_proof.h) to every handshake step; version 3
// a tag after every frame's payload (frame_auth.h); version 4 the step
// record and parameter repair to the step's control messages
// (server/worker/step_protocol.h), which travel in these frames; version 5
// the step each handed-over momentum holds (server/worker/
// momentum_handover.h's HeldItem); version 6 control gathers and broadcasts
// passed along a tree of the ranks (rank_tree.h) as point-to-point frames,
// a rank's subtree in one message (server/worker/step_control.h).
constexpr uint32_t kWireVersion = 6;

// The stage or outcome a Handshake message carries. A connection opens with
// three: the connecting rank's kHello, the accepting rank's verdict, and,
// if that is kAccepted, the connecting rank's kConfirmed. The third step lets
// the accepting rank drop a hello whose sender has since given up (it sees
// the connection close instead of a confirmation).
enum class HandshakeVerdict : uint32_t {
  kHello = 0,
  kAccepted = 1,
  kConfirmed = 2,
  kWrongSession = 3,
  kWrongRank = 4,
  kWrongWorldSize = 5,
  kWrongVersion = 6,
};

// Human-readable reason for `verdict`, e.g. "session mismatch".
absl::string_view HandshakeVerdictName(HandshakeVerdict verdict);

// Sizes of a handshake's fresh random nonce and of its HMAC-SHA256
// membership proof.
constexpr size_t kNonceBytes = 32;
constexpr size_t kMembershipProofBytes = 32;
using Nonce = std::array<unsigned char, kNonceBytes>;
using MembershipProof = std::array<unsigned char, kMembershipProofBytes>;
// A key that authenticates the frames of one direction of one connection.
using FrameKey = std::array<unsigned char, 32>;

// One step of the handshake, sent by the connecting (higher) rank (hello,
// confirmation) or the accepting (lower) rank (verdict); each side fills in
// its own version, session, rank and world size. `nonce` is the sender's
// fresh nonce (in the hello and in an acceptance; zero otherwise); `proof`
// is the sender's membership proof (in an acceptance and in the
// confirmation; zero otherwise).
struct Handshake {
  uint32_t version = kWireVersion;
  uint64_t session = 0;
  int32_t from_rank = 0;
  int32_t to_rank = 0;
  int32_t world_size = 0;
  HandshakeVerdict verdict = HandshakeVerdict::kHello;
  Nonce nonce = {};
  MembershipProof proof = {};
};

// Version 1's 32 bytes, then the nonce and the proof.
constexpr size_t kHandshakeBytes = 32 + kNonceBytes + kMembershipProofBytes;
void EncodeHandshake(const Handshake& handshake,
                     unsigned char out[kHandshakeBytes]);
// False if `in` does not start with the handshake magic: not a muonps peer.
bool DecodeHandshake(const unsigned char in[kHandshakeBytes], Handshake* out);

// Which call produced a message; a receiver expecting another kind has
// issued its calls in a different order than the sender.
enum class MessageKind : uint32_t {
  kPointToPoint = 1,
  kReduce = 2,
  kBroadcast = 3,
};

// "send/recv", "reduce", "broadcast", or "unknown" for any other value.
absl::string_view MessageKindName(MessageKind kind);

// In front of every message's payload. `sequence` counts the messages of
// one direction of one connection from 0, so a lost or reordered message is
// seen at once; `bytes` is the payload length that follows.
struct FrameHeader {
  MessageKind kind = MessageKind::kPointToPoint;
  uint64_t sequence = 0;
  uint64_t bytes = 0;
};

constexpr size_t kFrameHeaderBytes = 24;
// After every frame's payload: its tag (frame_auth.h).
constexpr size_t kFrameTagBytes = 16;
using FrameTag = std::array<unsigned char, kFrameTagBytes>;
void EncodeFrameHeader(const FrameHeader& header,
                       unsigned char out[kFrameHeaderBytes]);
// False if `in` does not start with the frame magic: the stream lost sync.
bool DecodeFrameHeader(const unsigned char in[kFrameHeaderBytes],
                       FrameHeader* out);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_WIRE_FORMAT_H_
