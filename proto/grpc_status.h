// The one conversion between gRPC and absl statuses and deadlines, for
// every server and client of muonps.v1 (STYLE.md: one place per
// conversion). The codes share gRPC's numbering; messages pass unchanged.
// Pure functions; thread-safe.
#ifndef MUONPS_PROTO_GRPC_STATUS_H_
#define MUONPS_PROTO_GRPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muonps {

// A server's answer for `status` (OK for OK).
grpc::Status ToGrpc(const absl::Status& status);

// A client's view of an RPC's `status`: OK for OK, else the same code with
// the message "<what>: <message>" (just the message when `what` is empty).
absl::Status FromGrpc(const grpc::Status& status, absl::string_view what);

// A ClientContext deadline `timeout` from now.
std::chrono::system_clock::time_point DeadlineIn(absl::Duration timeout);

}  // namespace muonps

#endif  // MUONPS_PROTO_GRPC_STATUS_H_
