// The control plane with real processes on loopback: one muonps-coordinator
// and a muonps-worker daemon. Proves that the worker's local socket refuses
// every muonps.v1.Worker method and reflection to a caller without the
// bearer token or with a wrong one, answers health, and serves GetStatus
// with the token.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "proto/credentials.h"
#include "tests/control_plane_fixture.h"
#include "tests/harness/raw_unary_call.h"

namespace muonps {
namespace {

using control_plane_test::ControlPlaneTest;
using control_plane_test::Deadline;
using control_plane_test::kWaitTimeout;

// The worker's local socket is behind the same bearer token as the
// coordinator: every muonps.v1.Worker method (taken from the service
// descriptor) and reflection refuse a caller without it or with a wrong
// one; health answers; with the token GetStatus works.
TEST_F(ControlPlaneTest, WorkerSocketRefusesCallersWithoutTheToken) {
  ASSERT_NO_FATAL_FAILURE(StartWorker("w0"));
  ASSERT_TRUE(WaitForPlanOf({"w0"}, kWaitTimeout).ok());
  const std::string target = "unix:" + workers_.at("w0").socket;
  const std::string wrong = dir_ + "/wrong-token";
  std::ofstream(wrong) << "0123456789abcdef0123456789abcdef\n";
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "muonps.v1.Worker");
  ASSERT_NE(service, nullptr);
  for (const std::string& token_file : {std::string(), wrong}) {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        OpenChannel(target, {.token_file = token_file});
    ASSERT_TRUE(channel.ok());
    for (int i = 0; i < service->method_count(); ++i) {
      const std::string method =
          absl::StrCat("/muonps.v1.Worker/", service->method(i)->name());
      grpc::ClientContext context;
      context.set_deadline(Deadline(absl::Seconds(5)));
      std::string response;
      const grpc::Status status =
          testing::RawUnaryCall(*channel, &context, method, "", &response);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << method << " (token file \"" << token_file
          << "\"): " << status.error_message();
    }
    grpc::ClientContext health_context;
    health_context.set_deadline(Deadline(absl::Seconds(5)));
    grpc::health::v1::HealthCheckResponse serving;
    EXPECT_TRUE(grpc::health::v1::Health::NewStub(*channel)
                    ->Check(&health_context, {}, &serving)
                    .ok());
  }
  std::unique_ptr<v1::Worker::Stub> stub =
      v1::Worker::NewStub(testing::TestChannel(target));
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(5)));
  v1::WorkerStatus status;
  EXPECT_TRUE(stub->GetStatus(&context, {}, &status).ok());
  EXPECT_EQ(status.worker_id(), "w0");
}

}  // namespace
}  // namespace muonps
