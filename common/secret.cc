#include "common/secret.h"

#include <sys/random.h>

#include <cerrno>
#include <vector>

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

}  // namespace muonps
