#include "common/secret.h"

#include <arpa/inet.h>
#include <sys/random.h>

#include <cerrno>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace muonps {

std::string RandomHex(int bytes) {
  std::vector<unsigned char> raw(static_cast<size_t>(bytes > 0 ? bytes : 0));
  size_t filled = 0;
  while (filled < raw.size()) {
    const ssize_t n = getrandom(raw.data() + filled, raw.size() - filled, 0);
    if (n > 0) filled += static_cast<size_t>(n);
  }
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(raw.size() * 2);
  for (unsigned char b : raw) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

bool SecretsEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

bool IsLoopbackHost(absl::string_view host) {
  host = absl::StripPrefix(absl::StripSuffix(host, "]"), "[");
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  const std::string text(host);
  in_addr v4;
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6);
  }
  return false;
}

}  // namespace muonps
