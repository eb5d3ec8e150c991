// libFuzzer target: the TCP transport's handshake and frame-header decoders
// (transport/wire_format.h) on arbitrary bytes. Whatever decodes must encode
// back to the same bytes (the format has no slack a peer could hide data
// in), and naming a decoded verdict or message kind must not fail.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "transport/wire_format.h"

namespace muonps {
namespace transport {
namespace {

// Decodes `in` as a handshake; on success checks the round trip.
void CheckHandshake(const unsigned char in[kHandshakeBytes]) {
  Handshake handshake;
  if (!DecodeHandshake(in, &handshake)) return;
  (void)HandshakeVerdictName(handshake.verdict);
  unsigned char again[kHandshakeBytes];
  EncodeHandshake(handshake, again);
  if (std::memcmp(in, again, kHandshakeBytes) != 0) std::abort();
}

// Decodes `in` as a frame header; on success checks the round trip.
void CheckFrameHeader(const unsigned char in[kFrameHeaderBytes]) {
  FrameHeader header;
  if (!DecodeFrameHeader(in, &header)) return;
  (void)MessageKindName(header.kind);
  unsigned char again[kFrameHeaderBytes];
  EncodeFrameHeader(header, again);
  if (std::memcmp(in, again, kFrameHeaderBytes) != 0) std::abort();
}

}  // namespace
}  // namespace transport
}  // namespace muonps

// The input is read as a stream: a handshake, then frame headers back to
// back (as a connection carries them, payloads left out); a short tail is
// zero-padded so every input reaches both decoders.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonps::transport;
  unsigned char handshake[kHandshakeBytes] = {};
  std::memcpy(handshake, data, size < kHandshakeBytes ? size : kHandshakeBytes);
  CheckHandshake(handshake);
  size_t offset = size < kHandshakeBytes ? size : kHandshakeBytes;
  do {
    unsigned char header[kFrameHeaderBytes] = {};
    const size_t n =
        size - offset < kFrameHeaderBytes ? size - offset : kFrameHeaderBytes;
    std::memcpy(header, data + offset, n);
    CheckFrameHeader(header);
    offset += n;
  } while (offset < size);
  return 0;
}
