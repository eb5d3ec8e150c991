// Under mutual TLS a worker's id is bound to the client certificate it
// joined with, with a real muonps-coordinator (--tls_client_ca_file) and
// two client certificates of the test CA: a caller holding the deployment
// token but the other certificate cannot heartbeat, leave or join as that
// worker (PERMISSION_DENIED naming worker_id and both certificates), and
// nothing changes; the worker's own certificate goes on.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/credentials.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

std::chrono::system_clock::time_point Soon() {
  return std::chrono::system_clock::now() + std::chrono::seconds(10);
}

class CertificateBindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::NewTempDir("certificate-binding");
    std::vector<std::string> argv = {
        testing::BinaryPath("server/coordinator/muonps-coordinator"),
        "--port=0",
        "--metrics_port=-1",
        "--lease_ttl_ms=3000",
        "--heartbeat_interval_ms=500",
        "--tls_client_ca_file=" + testing::TestCredential("ca.pem")};
    for (std::string& flag : testing::SecuredCoordinatorFlags()) {
      argv.push_back(std::move(flag));
    }
    absl::StatusOr<std::unique_ptr<testing::ChildProcess>> started =
        testing::ChildProcess::Start(argv, dir_ + "/coordinator.log");
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    absl::StatusOr<std::string> port = coordinator_->WaitForLog(
        R"(listening on 127\.0\.0\.1:(\d+))", absl::Seconds(30));
    ASSERT_TRUE(port.ok()) << port.status();
    address_ = "127.0.0.1:" + *port;
  }

  // A stub presenting client certificate `name` ("client" or "client2").
  std::unique_ptr<v1::Coordinator::Stub> StubAs(const std::string& name) {
    SecurityConfig config;
    config.token_file = testing::TestCredential("token");
    config.tls_ca_file = testing::TestCredential("ca.pem");
    config.tls_cert_file = testing::TestCredential(name + ".pem");
    config.tls_key_file = testing::TestCredential(name + ".key");
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        OpenChannel(address_, config);
    EXPECT_TRUE(channel.ok()) << channel.status();
    return v1::Coordinator::NewStub(*channel);
  }

  std::string dir_;
  std::unique_ptr<testing::ChildProcess> coordinator_;
  std::string address_;
};

TEST_F(CertificateBindingTest, AnotherCertificateCannotActAsAJoinedWorker) {
  auto mine = StubAs("client");
  auto other = StubAs("client2");
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::CreateJobRequest create;
    create.mutable_job()->set_name("bound");
    v1::Matrix* m = create.mutable_job()->add_matrices();
    m->set_name("layers.0.w");
    m->set_rows(64);
    m->set_cols(64);
    v1::Job job;
    const grpc::Status status = mine->CreateJob(&context, create, &job);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  v1::JoinJobRequest join;
  join.set_job("bound");
  join.set_worker_id("w1");
  join.set_instance_id("i-w1");
  join.mutable_device()->set_kind("cpu");
  join.mutable_device()->set_memory_bytes(int64_t{4} << 30);
  join.set_data_address("127.0.0.1:1");
  v1::JoinJobResponse joined;
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    const grpc::Status status = mine->JoinJob(&context, join, &joined);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  v1::HeartbeatRequest beat;
  beat.set_job("bound");
  beat.set_worker_id("w1");
  beat.set_instance_id("i-w1");
  beat.set_plan_version(joined.plan_version());
  beat.set_worker_token(joined.worker_token());
  auto heartbeat = [&](v1::Coordinator::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::HeartbeatResponse response;
    return stub.Heartbeat(&context, beat, &response);
  };
  ASSERT_TRUE(heartbeat(*mine).ok());
  // The token and the worker token, but the other certificate.
  grpc::Status refused = heartbeat(*other);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "worker_id"))
      << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "CN=muonps-client "))
      << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "CN=muonps-client2"))
      << refused.error_message();
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::JoinJobRequest intruder = join;
    intruder.set_instance_id("intruder");
    v1::JoinJobResponse response;
    refused = other->JoinJob(&context, intruder, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << refused.error_message();
  }
  {
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::LeaveJobRequest leave;
    leave.set_job("bound");
    leave.set_worker_id("w1");
    leave.set_instance_id("i-w1");
    leave.set_worker_token(joined.worker_token());
    v1::LeaveJobResponse response;
    refused = other->LeaveJob(&context, leave, &response);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << refused.error_message();
  }
  // Nothing changed: the worker's own certificate goes on.
  EXPECT_TRUE(heartbeat(*mine).ok());
}

}  // namespace
}  // namespace muonps
