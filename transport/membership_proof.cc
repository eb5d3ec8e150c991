#include "transport/membership_proof.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace transport {
namespace {

// Distinct labels per side, so one side's proof never verifies as the
// other's (a reflection of the acceptance back as a confirmation).
constexpr absl::string_view kAcceptingLabel = "muonps data plane: accepting";
constexpr absl::string_view kConnectingLabel = "muonps data plane: connecting";

void AppendU32(uint32_t value, std::string* out) {
  for (int i = 0; i < 4; ++i)
    out->push_back(static_cast<char>(value >> (8 * i)));
}

void AppendU64(uint64_t value, std::string* out) {
  for (int i = 0; i < 8; ++i)
    out->push_back(static_cast<char>(value >> (8 * i)));
}

// Fixed-width fields after a NUL-terminated label: no two transcripts
// encode to the same bytes.
std::string Encode(ProvingSide side, const HandshakeTranscript& t) {
  std::string bytes(side == ProvingSide::kAcceptingRank ? kAcceptingLabel
                                                        : kConnectingLabel);
  bytes.push_back('\0');
  AppendU32(t.version, &bytes);
  AppendU64(t.session, &bytes);
  AppendU32(static_cast<uint32_t>(t.connecting_rank), &bytes);
  AppendU32(static_cast<uint32_t>(t.accepting_rank), &bytes);
  AppendU32(static_cast<uint32_t>(t.world_size), &bytes);
  bytes.append(reinterpret_cast<const char*>(t.connecting_nonce.data()),
               t.connecting_nonce.size());
  bytes.append(reinterpret_cast<const char*>(t.accepting_nonce.data()),
               t.accepting_nonce.size());
  return bytes;
}

}  // namespace

absl::Status CheckDataPlaneSecret(absl::string_view secret,
                                  absl::string_view field) {
  if (secret.size() >= kMinDataPlaneSecretBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": ", secret.empty() ? "empty" : "too short", " (", secret.size(),
      " bytes); the job's data-plane secret from the coordinator has at least ",
      kMinDataPlaneSecretBytes, " bytes"));
}

absl::StatusOr<Nonce> FreshNonce() {
  Nonce nonce;
  if (RAND_bytes(nonce.data(), static_cast<int>(nonce.size())) != 1) {
    return absl::InternalError(
        "RAND_bytes could not produce a handshake nonce");
  }
  return nonce;
}

absl::StatusOr<MembershipProof> ProveMembership(
    absl::string_view secret, ProvingSide side,
    const HandshakeTranscript& transcript) {
  const std::string message = Encode(side, transcript);
  MembershipProof proof = {};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), proof.data(), &length) == nullptr ||
      length != proof.size()) {
    return absl::InternalError("HMAC-SHA256 of the handshake failed");
  }
  return proof;
}

absl::StatusOr<FrameKey> DeriveFrameKey(absl::string_view secret,
                                        ProvingSide sender,
                                        const HandshakeTranscript& transcript) {
  const std::string message = absl::StrCat(
      "muonps frame key", std::string(1, '\0'), Encode(sender, transcript));
  FrameKey key = {};
  unsigned int length = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), key.data(), &length) == nullptr ||
      length != key.size()) {
    return absl::InternalError("HMAC-SHA256 of the frame key failed");
  }
  return key;
}

bool VerifyMembership(absl::string_view secret, ProvingSide side,
                      const HandshakeTranscript& transcript,
                      const MembershipProof& proof) {
  const absl::StatusOr<MembershipProof> expected =
      ProveMembership(secret, side, transcript);
  return expected.ok() &&
         CRYPTO_memcmp(expected->data(), proof.data(), proof.size()) == 0;
}

}  // namespace transport
}  // namespace muonps
