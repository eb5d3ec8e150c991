// ErrorHint: what a user of the CLI does next after a call to the
// coordinator failed. gRPC's own messages ("Socket closed", "failed to
// connect to all addresses") say what broke, not that a token or a CA is
// missing or that the address is wrong; the hint names the flag or the
// environment variable to set, or the command that starts a coordinator.
// Thread-compatible (a pure function).
#ifndef MUONPS_TOOLS_MUONPS_ERROR_HINT_H_
#define MUONPS_TOOLS_MUONPS_ERROR_HINT_H_

#include <grpcpp/grpcpp.h>

#include <string>

namespace muonps {
namespace cli {

// How the failed call reached the coordinator.
struct CallSecurity {
  bool tls = false;    // a CA was given (--tls_ca_file or MUONPS_TLS_CA_FILE)
  bool token = false;  // a bearer token was sent
};

// One or more lines (each ending in '\n'), or "" where gRPC's message is
// already what the user needs (a bad field, a missing job).
std::string ErrorHint(const grpc::Status& status, const std::string& address,
                      const CallSecurity& security);

}  // namespace cli
}  // namespace muonps

#endif  // MUONPS_TOOLS_MUONPS_ERROR_HINT_H_
