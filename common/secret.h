// Secrets the services hand out and compare (bearer tokens, worker and job
// credentials, the data plane's per-job key), and where a server may go
// without them (loopback). Pure functions; thread-safe.
#ifndef MUONPS_COMMON_SECRET_H_
#define MUONPS_COMMON_SECRET_H_

#include <string>

#include "absl/strings/string_view.h"

namespace muonps {

// 2 * `bytes` lowercase hex characters from the kernel's random source
// (getrandom; blocks only until the kernel's pool is first seeded).
std::string RandomHex(int bytes);

// Equality of two secrets in time that depends only on their lengths, so
// that a caller guessing one learns nothing from how long a refusal took.
bool SecretsEqual(absl::string_view a, absl::string_view b);

// True for 127.0.0.0/8, ::1 and "localhost" (brackets allowed): the
// addresses on which a server may listen without TLS or a bearer token.
bool IsLoopbackHost(absl::string_view host);

}  // namespace muonps

#endif  // MUONPS_COMMON_SECRET_H_
