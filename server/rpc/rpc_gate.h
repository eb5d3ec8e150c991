// RpcGate: the one way a muonps gRPC server answers a call. It checks the
// caller's bearer token before anything else (UNAUTHENTICATED, the handler
// not run, one warning logged with the peer), runs the handler, which
// returns absl::StatusOr<Reply> (or absl::Status for a stream or a call
// whose reply is empty), copies the reply out only on success, and turns
// the status into the grpc::Status in one place (ToGrpc, proto/grpc_status.h).
// An optional observer is told of every call once it ends (metrics).
//
//   RpcGate gate_(token);
//   grpc::Status Attach(grpc::ServerContext* context,
//                       const v1::AttachRequest* request,
//                       v1::AttachResponse* out) override {
//     return gate_.Serve(*context, "Attach", out,
//                        [&]() -> absl::StatusOr<v1::AttachResponse> {
//                          return ...;  // convert, call the core, convert
//                        });
//   }
//
// Thread-safe: one gate serves every call of a service at once.
#ifndef MUONPS_SERVER_RPC_RPC_GATE_H_
#define MUONPS_SERVER_RPC_RPC_GATE_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "proto/grpc_status.h"

namespace muonps {
namespace server {

class RpcGate {
 public:
  // Told of every call once it ends, refused ones included: the method
  // name given to Serve, the call's final status and its wall time. Runs on
  // the call's thread before the answer goes out; must be thread-safe.
  using Observer =
      std::function<void(absl::string_view method, const absl::Status& status,
                         absl::Duration elapsed)>;

  // Every call must carry `token` as "authorization: Bearer TOKEN"; an
  // empty `token` checks nothing. `observer` may be empty.
  explicit RpcGate(std::string token, Observer observer = nullptr)
      : token_(std::move(token)), observer_(std::move(observer)) {}
  RpcGate(const RpcGate&) = delete;
  RpcGate& operator=(const RpcGate&) = delete;

  // A unary call: `handler()` returns absl::StatusOr<Reply>; its value goes
  // to `*out` when OK (`*out` is left alone otherwise). The handler runs
  // only for a caller with the token.
  template <typename Reply, typename Handler>
  grpc::Status Serve(const grpc::ServerContext& context, const char* method,
                     Reply* out, Handler&& handler) const {
    return Serve(context, method, [&]() -> absl::Status {
      absl::StatusOr<Reply> reply = handler();
      if (!reply.ok()) return reply.status();
      *out = *std::move(reply);
      return absl::OkStatus();
    });
  }

  // A stream, or a call whose reply is empty: `handler()` returns
  // absl::Status (and writes a stream's messages itself).
  template <typename Handler>
  grpc::Status Serve(const grpc::ServerContext& context, const char* method,
                     Handler&& handler) const {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = Admit(context, method);
    if (status.ok()) status = handler();
    return Finish(method, status, start);
  }

 private:
  // OK for a caller with the token; UNAUTHENTICATED (logged) otherwise.
  absl::Status Admit(const grpc::ServerContext& context,
                     const char* method) const;
  // Tells the observer and converts `status`.
  grpc::Status Finish(const char* method, const absl::Status& status,
                      std::chrono::steady_clock::time_point start) const;

  const std::string token_;
  const Observer observer_;
};

}  // namespace server
}  // namespace muonps

#endif  // MUONPS_SERVER_RPC_RPC_GATE_H_
