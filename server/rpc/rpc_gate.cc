#include "server/rpc/rpc_gate.h"

#include "proto/credentials.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace server {

absl::Status RpcGate::Admit(const grpc::ServerContext& context,
                            const char* method) const {
  absl::Status status = CheckBearerToken(context, token_);
  if (!status.ok()) {
    spdlog::warn("rpc {} from {} refused: {}", method, context.peer(),
                 std::string(status.message()));
  }
  return status;
}

grpc::Status RpcGate::Finish(
    const char* method, const absl::Status& status,
    std::chrono::steady_clock::time_point start) const {
  if (observer_) {
    observer_(method, status,
              absl::FromChrono(std::chrono::steady_clock::now() - start));
  }
  return ToGrpc(status);
}

}  // namespace server
}  // namespace muonps
