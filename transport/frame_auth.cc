#include "transport/frame_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <climits>
#include <memory>

namespace muonps {
namespace transport {
namespace {

struct CipherContextFree {
  void operator()(EVP_CIPHER_CTX* context) const {
    EVP_CIPHER_CTX_free(context);
  }
};

// GCM's 96-bit nonce: the sequence number, then the kind (little-endian).
std::array<unsigned char, 12> NonceOf(const FrameHeader& header) {
  std::array<unsigned char, 12> nonce = {};
  for (int i = 0; i < 8; ++i) nonce[i] = (header.sequence >> (8 * i)) & 0xff;
  const uint32_t kind = static_cast<uint32_t>(header.kind);
  for (int i = 0; i < 4; ++i) nonce[8 + i] = (kind >> (8 * i)) & 0xff;
  return nonce;
}

}  // namespace

absl::StatusOr<FrameTag> TagFrame(const FrameKey& key,
                                  const FrameHeader& header,
                                  const void* payload, size_t bytes) {
  std::unique_ptr<EVP_CIPHER_CTX, CipherContextFree> context(
      EVP_CIPHER_CTX_new());
  const std::array<unsigned char, 12> nonce = NonceOf(header);
  unsigned char encoded[kFrameHeaderBytes];
  EncodeFrameHeader(header, encoded);
  int unused = 0;
  bool ok = context != nullptr &&
            EVP_EncryptInit_ex(context.get(), EVP_aes_256_gcm(), nullptr,
                               key.data(), nonce.data()) == 1 &&
            EVP_EncryptUpdate(context.get(), nullptr, &unused, encoded,
                              sizeof(encoded)) == 1;
  // Authenticated data only: nothing is encrypted, the tag covers it all.
  const auto* at = static_cast<const unsigned char*>(payload);
  for (size_t done = 0; ok && done < bytes;) {
    const int chunk = static_cast<int>(std::min<size_t>(bytes - done, 1 << 30));
    ok = EVP_EncryptUpdate(context.get(), nullptr, &unused, at + done, chunk) ==
         1;
    done += static_cast<size_t>(chunk);
  }
  FrameTag tag = {};
  unsigned char none[16];
  ok = ok && EVP_EncryptFinal_ex(context.get(), none, &unused) == 1 &&
       EVP_CIPHER_CTX_ctrl(context.get(), EVP_CTRL_GCM_GET_TAG,
                           static_cast<int>(tag.size()), tag.data()) == 1;
  if (!ok) return absl::InternalError("AES-GCM tag of a frame failed");
  return tag;
}

bool FrameTagMatches(const FrameKey& key, const FrameHeader& header,
                     const void* payload, size_t bytes, const FrameTag& tag) {
  const absl::StatusOr<FrameTag> expected =
      TagFrame(key, header, payload, bytes);
  return expected.ok() &&
         CRYPTO_memcmp(expected->data(), tag.data(), tag.size()) == 0;
}

}  // namespace transport
}  // namespace muonps
