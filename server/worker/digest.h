// Digest: FNV-1a over bytes, for what ranks compare with each other (a
// step's hyperparameters and bindings, the staging windows' ids, a host's
// identity). Only equality means anything: values are not kept across
// builds. Thread-compatible.
#ifndef MUONPS_SERVER_WORKER_DIGEST_H_
#define MUONPS_SERVER_WORKER_DIGEST_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace muonps {
namespace worker {

class Digest {
 public:
  void Mix(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) h_ = (h_ ^ p[i]) * 1099511628211ull;
  }
  void Mix(double v) { Mix(&v, sizeof(v)); }
  void Mix(int64_t v) { Mix(&v, sizeof(v)); }
  // With its terminating NUL: "a" then "b" differs from "ab".
  void Mix(const std::string& s) { Mix(s.data(), s.size() + 1); }
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 1469598103934665603ull;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_DIGEST_H_
