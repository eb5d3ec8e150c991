// The client certificate a call came with, under mutual TLS: what a
// coordinator binds a worker's id to (docs/architecture.md, Security).
// Thread-safe.
#ifndef MUONPS_SERVER_RPC_PEER_CERTIFICATE_H_
#define MUONPS_SERVER_RPC_PEER_CERTIFICATE_H_

#include <grpcpp/grpcpp.h>

#include <string>

namespace muonps {
namespace server {

// The caller's client certificate as "CN=<common name> sha256:<fingerprint
// of its PEM>", or "" when the call carried none (no mutual TLS). Two calls
// give the same string only with the same certificate.
std::string PeerCertificate(const grpc::ServerContext& context);

}  // namespace server
}  // namespace muonps

#endif  // MUONPS_SERVER_RPC_PEER_CERTIFICATE_H_
