#include "tools/muonps/error_hint.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace muonps {
namespace cli {

std::string ErrorHint(const grpc::Status& status, const std::string& address,
                      const CallSecurity& security) {
  const std::string& message = status.error_message();
  switch (status.error_code()) {
    case grpc::StatusCode::UNAUTHENTICATED:
      if (!security.token) {
        return "hint: this coordinator wants a bearer token: pass --token_file "
               "FILE or export MUONPS_TOKEN_FILE=FILE\n";
      }
      return "hint: the coordinator refused this token: check --token_file / "
             "MUONPS_TOKEN_FILE (a job's token is good for its own job only)\n";
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return absl::StrCat(
          "hint: no answer from ", address,
          " within --timeout_ms: is it a muonps coordinator?\n");
    case grpc::StatusCode::UNAVAILABLE:
      break;
    default:
      return "";
  }
  if (!absl::StrContains(address, ':')) {
    return absl::StrCat("hint: --coordinator takes HOST:PORT; \"", address,
                        "\" has no port\n");
  }
  if (absl::StrContains(message, "DNS resolution failed") ||
      absl::StrContains(message, "Name or service not known")) {
    return absl::StrCat("hint: cannot resolve the host of ", address,
                        " (--coordinator HOST:PORT)\n");
  }
  if (absl::StrContains(message, "Connection refused")) {
    return absl::StrCat(
        "hint: nothing listens at ", address,
        ". Start a coordinator there (plaintext, for a trial:\n"
        "  muonps-coordinator --port PORT --insecure\n"
        "or deploy/local/launch.sh --keep-running, which prints the "
        "address) or point\n--coordinator HOST:PORT at a running one.\n");
  }
  if (security.tls) {
    return absl::StrCat(
        "hint: the TLS connection to ", address,
        " failed: does the coordinator serve TLS, and did the CA in\n"
        "--tls_ca_file / MUONPS_TLS_CA_FILE sign its certificate (its name "
        "must match the host)?\n");
  }
  return absl::StrCat(
      "hint: ", address,
      " closed a plaintext connection. If that coordinator serves TLS, pass\n"
      "--tls_ca_file FILE or export MUONPS_TLS_CA_FILE=FILE (and its token: "
      "MUONPS_TOKEN_FILE).\n");
}

}  // namespace cli
}  // namespace muonps
