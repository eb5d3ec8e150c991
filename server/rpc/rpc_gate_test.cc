// RpcGate: a caller without the token is refused before the handler runs,
// a handler's value reaches the reply only when it is OK, its status keeps
// code and message on the way to gRPC, and the observer sees every call.
#include "server/rpc/rpc_gate.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace muonps {
namespace server {
namespace {

struct Observed {
  std::string method;
  absl::StatusCode code;
};

TEST(RpcGateTest, ACallerWithoutTheTokenIsRefusedBeforeTheHandlerRuns) {
  std::vector<Observed> seen;
  RpcGate gate("0123456789abcdef0123",
               [&](absl::string_view method, const absl::Status& status,
                   absl::Duration) {
                 seen.push_back({std::string(method), status.code()});
               });
  grpc::ServerContext context;  // no authorization metadata
  bool ran = false;
  std::string out = "untouched";
  const grpc::Status status =
      gate.Serve(context, "Get", &out, [&]() -> absl::StatusOr<std::string> {
        ran = true;
        return std::string("reply");
      });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(ran);
  EXPECT_EQ(out, "untouched");
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].method, "Get");
  EXPECT_EQ(seen[0].code, absl::StatusCode::kUnauthenticated);
}

TEST(RpcGateTest, TheReplyIsCopiedOutOnlyWhenTheHandlerSucceeds) {
  RpcGate gate("");  // no token: every caller is let in
  grpc::ServerContext context;
  std::string out;
  EXPECT_TRUE(gate.Serve(context, "Get", &out,
                         []() -> absl::StatusOr<std::string> {
                           return std::string("reply");
                         })
                  .ok());
  EXPECT_EQ(out, "reply");
  out = "kept";
  const grpc::Status failed =
      gate.Serve(context, "Get", &out, []() -> absl::StatusOr<std::string> {
        return absl::NotFoundError("job: \"x\" does not exist");
      });
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(failed.error_message(), "job: \"x\" does not exist");
  EXPECT_EQ(out, "kept");
}

TEST(RpcGateTest, AStatusHandlerIsObservedWithItsCodeAndTime) {
  std::vector<Observed> seen;
  absl::Duration elapsed = absl::ZeroDuration();
  RpcGate gate("", [&](absl::string_view method, const absl::Status& status,
                       absl::Duration d) {
    seen.push_back({std::string(method), status.code()});
    elapsed = d;
  });
  grpc::ServerContext context;
  const grpc::Status status = gate.Serve(context, "Watch", [] {
    return absl::ResourceExhaustedError("too many streams");
  });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].method, "Watch");
  EXPECT_EQ(seen[0].code, absl::StatusCode::kResourceExhausted);
  EXPECT_GE(elapsed, absl::ZeroDuration());
}

}  // namespace
}  // namespace server
}  // namespace muonps
