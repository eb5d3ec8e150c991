#include "transport/wire_format.h"

#include <algorithm>

namespace muonps {
namespace transport {
namespace {

constexpr uint32_t kHandshakeMagic = 0x4853504d;  // "MPSH" on the wire.
constexpr uint32_t kFrameMagic = 0x4653504d;      // "MPSF" on the wire.

void PutU32(uint32_t value, unsigned char* out) {
  for (int i = 0; i < 4; ++i)
    out[i] = static_cast<unsigned char>(value >> (8 * i));
}

void PutU64(uint64_t value, unsigned char* out) {
  for (int i = 0; i < 8; ++i)
    out[i] = static_cast<unsigned char>(value >> (8 * i));
}

uint32_t GetU32(const unsigned char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}

uint64_t GetU64(const unsigned char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

}  // namespace

absl::string_view HandshakeVerdictName(HandshakeVerdict verdict) {
  switch (verdict) {
    case HandshakeVerdict::kHello:
      return "hello";
    case HandshakeVerdict::kAccepted:
      return "accepted";
    case HandshakeVerdict::kConfirmed:
      return "confirmed";
    case HandshakeVerdict::kWrongSession:
      return "session mismatch";
    case HandshakeVerdict::kWrongRank:
      return "rank mismatch";
    case HandshakeVerdict::kWrongWorldSize:
      return "world size mismatch";
    case HandshakeVerdict::kWrongVersion:
      return "wire version mismatch";
  }
  return "unknown verdict";
}

void EncodeHandshake(const Handshake& handshake,
                     unsigned char out[kHandshakeBytes]) {
  PutU32(kHandshakeMagic, out);
  PutU32(handshake.version, out + 4);
  PutU64(handshake.session, out + 8);
  PutU32(static_cast<uint32_t>(handshake.from_rank), out + 16);
  PutU32(static_cast<uint32_t>(handshake.to_rank), out + 20);
  PutU32(static_cast<uint32_t>(handshake.world_size), out + 24);
  PutU32(static_cast<uint32_t>(handshake.verdict), out + 28);
  std::copy(handshake.nonce.begin(), handshake.nonce.end(), out + 32);
  std::copy(handshake.proof.begin(), handshake.proof.end(),
            out + 32 + kNonceBytes);
}

bool DecodeHandshake(const unsigned char in[kHandshakeBytes], Handshake* out) {
  if (GetU32(in) != kHandshakeMagic) return false;
  out->version = GetU32(in + 4);
  out->session = GetU64(in + 8);
  out->from_rank = static_cast<int32_t>(GetU32(in + 16));
  out->to_rank = static_cast<int32_t>(GetU32(in + 20));
  out->world_size = static_cast<int32_t>(GetU32(in + 24));
  out->verdict = static_cast<HandshakeVerdict>(GetU32(in + 28));
  std::copy(in + 32, in + 32 + kNonceBytes, out->nonce.begin());
  std::copy(in + 32 + kNonceBytes, in + kHandshakeBytes, out->proof.begin());
  return true;
}

absl::string_view MessageKindName(MessageKind kind) {
  switch (kind) {
    case MessageKind::kPointToPoint:
      return "send/recv";
    case MessageKind::kReduce:
      return "reduce";
    case MessageKind::kBroadcast:
      return "broadcast";
  }
  return "unknown";
}

void EncodeFrameHeader(const FrameHeader& header,
                       unsigned char out[kFrameHeaderBytes]) {
  PutU32(kFrameMagic, out);
  PutU32(static_cast<uint32_t>(header.kind), out + 4);
  PutU64(header.sequence, out + 8);
  PutU64(header.bytes, out + 16);
}

bool DecodeFrameHeader(const unsigned char in[kFrameHeaderBytes],
                       FrameHeader* out) {
  if (GetU32(in) != kFrameMagic) return false;
  out->kind = static_cast<MessageKind>(GetU32(in + 4));
  out->sequence = GetU64(in + 8);
  out->bytes = GetU64(in + 16);
  return true;
}

}  // namespace transport
}  // namespace muonps
