// The job-membership proof of the data-plane handshake. The coordinator
// hands a per-job secret (random bytes) only to workers that joined the job;
// a rank proves it holds that secret with an HMAC-SHA256, keyed by it, over
// a HandshakeTranscript: the wire version, the session, both ranks, the
// world size and a fresh random nonce from each side. Because each side
// contributes a fresh nonce, a proof recorded from one connection is worth
// nothing on another (no replay); because the ranks, the session and the
// world size are inside the MAC, a proof cannot be redirected to another
// rank or session; because the prover's side is inside it too, the
// accepting rank's proof cannot be reflected back as the connecting rank's.
// The secret never leaves the process and no function here quotes it.
// Pure functions over OpenSSL's libcrypto; thread-safe.
#ifndef MUONPS_TRANSPORT_MEMBERSHIP_PROOF_H_
#define MUONPS_TRANSPORT_MEMBERSHIP_PROOF_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "transport/wire_format.h"

namespace muonps {
namespace transport {

// The shortest data-plane secret accepted: 128 bits.
constexpr size_t kMinDataPlaneSecretBytes = 16;

// OK if `secret` has at least kMinDataPlaneSecretBytes bytes; otherwise
// INVALID_ARGUMENT naming `field` and the length (never the bytes).
absl::Status CheckDataPlaneSecret(absl::string_view secret,
                                  absl::string_view field);

// A fresh nonce from the OS-seeded CSPRNG (RAND_bytes); INTERNAL if
// libcrypto cannot produce one.
absl::StatusOr<Nonce> FreshNonce();

// Which side of a connection a proof comes from: the accepting (lower) rank
// proves in its acceptance, the connecting (higher) rank in its
// confirmation.
enum class ProvingSide { kAcceptingRank, kConnectingRank };

// Everything a membership proof binds.
struct HandshakeTranscript {
  uint32_t version = kWireVersion;
  uint64_t session = 0;
  int32_t connecting_rank = 0;
  int32_t accepting_rank = 0;
  int32_t world_size = 0;
  Nonce connecting_nonce = {};
  Nonce accepting_nonce = {};
};

// HMAC-SHA256 keyed by `secret` over `side` and `transcript`; INTERNAL if
// libcrypto fails (out of memory).
absl::StatusOr<MembershipProof> ProveMembership(
    absl::string_view secret, ProvingSide side,
    const HandshakeTranscript& transcript);

// True if `proof` is ProveMembership(secret, side, transcript), compared in
// constant time (CRYPTO_memcmp); false if libcrypto fails.
bool VerifyMembership(absl::string_view secret, ProvingSide side,
                      const HandshakeTranscript& transcript,
                      const MembershipProof& proof);

// The key of the frames `sender` sends on the connection of `transcript`
// (frame_auth.h): HMAC-SHA256 keyed by `secret` over a label of its own,
// the side and the transcript. Each direction of each connection gets its
// own key, fresh with the handshake's nonces, and no key is a proof.
// INTERNAL if libcrypto fails.
absl::StatusOr<FrameKey> DeriveFrameKey(absl::string_view secret,
                                        ProvingSide sender,
                                        const HandshakeTranscript& transcript);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_MEMBERSHIP_PROOF_H_
