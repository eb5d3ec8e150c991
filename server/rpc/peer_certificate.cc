#include "server/rpc/peer_certificate.h"

#include <openssl/sha.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace muonps {
namespace server {
namespace {

std::string First(const grpc::AuthContext& auth, const char* property) {
  const std::vector<grpc::string_ref> values =
      auth.FindPropertyValues(property);
  if (values.empty()) return "";
  return std::string(values.front().data(), values.front().size());
}

}  // namespace

std::string PeerCertificate(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return "";
  const std::string pem = First(*auth, GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (pem.empty()) return "";
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(pem.data()), pem.size(),
         digest);
  return absl::StrCat(
      "CN=", First(*auth, GRPC_X509_CN_PROPERTY_NAME), " sha256:",
      absl::BytesToHexString(absl::string_view(
          reinterpret_cast<const char*>(digest), sizeof(digest))));
}

}  // namespace server
}  // namespace muonps
