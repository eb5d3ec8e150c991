// Authenticating every frame of a data-plane connection. After its
// handshake (tcp_mesh.h), each direction of a connection has its own key
// (DeriveFrameKey, membership_proof.h); every frame then carries a tag
// after its payload: AES-256-GCM's GMAC, keyed by the sending direction's
// key, over the encoded frame header and the payload, with the header's
// sequence number and kind as the nonce. The sequence counts one
// direction's frames from 0 and keys are fresh per connection, so a nonce
// never repeats under a key. A frame whose tag does not verify (bytes
// injected or altered on the way, a frame replayed from another connection
// or out of order) is refused before the step uses it. GMAC runs at memory
// speed on CPUs with AES-NI and carry-less multiply
// (bench/results/2026-11-29-frame-auth-cpu.jsonl has the measured rate).
// Pure functions over OpenSSL's libcrypto; thread-safe.
#ifndef MUONPS_TRANSPORT_FRAME_AUTH_H_
#define MUONPS_TRANSPORT_FRAME_AUTH_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "transport/socket_io.h"
#include "transport/wire_format.h"

namespace muonps {
namespace transport {

// One side's keys of one connection: those of the frames it sends and of
// the frames it receives.
struct FrameKeys {
  FrameKey send = {};
  FrameKey receive = {};
};

// A connection whose handshake proved the peer's membership, with the
// keys its frames are authenticated by. Move-only.
struct Connection {
  Socket socket;
  FrameKeys keys;
  bool valid() const { return socket.valid(); }
};

// The tag of the frame with `header` and `bytes` of `payload` under `key`.
// INTERNAL if libcrypto fails.
absl::StatusOr<FrameTag> TagFrame(const FrameKey& key,
                                  const FrameHeader& header,
                                  const void* payload, size_t bytes);

// Whether `tag` is TagFrame(key, header, payload, bytes), compared in
// constant time; false if libcrypto fails.
bool FrameTagMatches(const FrameKey& key, const FrameHeader& header,
                     const void* payload, size_t bytes, const FrameTag& tag);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_FRAME_AUTH_H_
