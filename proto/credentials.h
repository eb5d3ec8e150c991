// The one place where muonps turns credential files into gRPC credentials,
// for every server (coordinator, worker) and every client (worker agent,
// client library, CLI, tests): TLS certificates, the bearer token every
// method but health checks, and the rule for when plaintext is allowed.
//
// Secrets come from files only (named by flags or by the MUONPS_* variables
// below), never from a command line, and never appear in logs or statuses.
//
// Rules a server applies (LoadServerSecurity):
//   - TLS when a certificate and key are given; with a client CA file as
//     well, mutual TLS (clients must present a certificate it signed).
//   - Plaintext only with `insecure`, and only on a loopback address.
//   - A non-loopback address needs TLS and a token, or the server refuses
//     to start.
// A client uses TLS exactly when it has a CA file (to verify the server);
// Unix-socket targets ("unix:...") are always plaintext, the socket's file
// mode and peer credentials being their protection. When the client has a
// token, every call carries "authorization: Bearer TOKEN".
//
// Functions are thread-safe; the returned objects are gRPC's, shared.
#ifndef MUONPS_PROTO_CREDENTIALS_H_
#define MUONPS_PROTO_CREDENTIALS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/secret.h"  // IsLoopbackHost

namespace muonps {

// Where a process finds its credentials. Every field is a path ("" when
// absent) except `insecure`.
struct SecurityConfig {
  // The bearer token (the file's first line; at least 16 characters, no
  // spaces). Servers require it on every method except grpc.health.v1;
  // clients send it.
  std::string token_file;
  // Server: its certificate chain and key. Client: its own certificate and
  // key, for servers that require mutual TLS.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Client: the CA that signs the server's certificate (turns on TLS).
  std::string tls_ca_file;
  // Server: the CA that signs client certificates (turns on mutual TLS).
  std::string tls_client_ca_file;
  // Server: allows plaintext on a loopback address (logged as a warning).
  bool insecure = false;
};

// `config` with each empty path taken from the environment:
// MUONPS_TOKEN_FILE, MUONPS_TLS_CERT_FILE, MUONPS_TLS_KEY_FILE,
// MUONPS_TLS_CA_FILE, MUONPS_TLS_CLIENT_CA_FILE.
SecurityConfig WithEnvironmentDefaults(SecurityConfig config);

// The token in `path`: its first line without surrounding whitespace.
// INVALID_ARGUMENT naming `what` and the path when it cannot be read, is
// empty, shorter than 16 characters or holds a space or control character.
absl::StatusOr<std::string> ReadToken(const std::string& path,
                                      absl::string_view what);

// A server's credentials and the token its methods check ("" for none).
struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::string token;
  bool tls = false;
};

// Loads the files of `config` for a server listening on `host` and applies
// the rules above. FAILED_PRECONDITION, naming the flag to set, when the
// rules refuse (plaintext without `insecure`, a non-loopback address without
// TLS and token); INVALID_ARGUMENT naming the file when one cannot be read.
// Logs a warning when it allows plaintext.
absl::StatusOr<ServerSecurity> LoadServerSecurity(const SecurityConfig& config,
                                                  absl::string_view host);

// OK when `expected` is empty or the call carries "authorization: Bearer
// <expected>" (compared in constant time); UNAUTHENTICATED otherwise, with a
// message saying what was missing or wrong (never the token).
absl::Status CheckBearerToken(const grpc::ServerContext& context,
                              absl::string_view expected);

// A channel to `target` with the credentials of `config` (see the client
// rules above) and `args`. It reconnects within a second of a restarted
// server (gRPC's own backoff grows to minutes; leases are seconds).
// INVALID_ARGUMENT naming the file when one cannot be read.
absl::StatusOr<std::shared_ptr<grpc::Channel>> OpenChannel(
    const std::string& target, const SecurityConfig& config,
    const grpc::ChannelArguments& args = grpc::ChannelArguments());

}  // namespace muonps

#endif  // MUONPS_PROTO_CREDENTIALS_H_
