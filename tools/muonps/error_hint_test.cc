// ErrorHint against the failures a user meets: a port nothing listens on, a
// TLS server called in plaintext, a plaintext server called with a CA (real
// gRPC servers on loopback), and a token server called without a token.
#include "tools/muonps/error_hint.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "proto/credentials.h"

namespace muonps {
namespace cli {
namespace {

using ::testing::HasSubstr;

std::string TlsFile(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/",
                      std::getenv("TEST_WORKSPACE"), "/tests/testdata/tls/",
                      name);
}

// A health check from a client with `config` to `address`.
grpc::Status Call(const std::string& address, const SecurityConfig& config) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      OpenChannel(address, config);
  EXPECT_TRUE(channel.ok()) << channel.status();
  auto stub = grpc::health::v1::Health::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  grpc::health::v1::HealthCheckResponse response;
  return stub->Check(&context, grpc::health::v1::HealthCheckRequest(),
                     &response);
}

// A server answering health checks on a free loopback port.
struct Server {
  explicit Server(std::shared_ptr<grpc::ServerCredentials> credentials) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port);
    builder.RegisterService(&health);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~Server() { server->Shutdown(); }
  grpc::health::v1::Health::Service health;  // every method UNIMPLEMENTED
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials() {
  absl::StatusOr<ServerSecurity> security =
      LoadServerSecurity({.tls_cert_file = TlsFile("server.pem"),
                          .tls_key_file = TlsFile("server.key")},
                         "127.0.0.1");
  EXPECT_TRUE(security.ok()) << security.status();
  return security->credentials;
}

TEST(ErrorHintTest, NothingListeningSuggestsACoordinatorCommandThatStarts) {
  std::string address;
  {
    Server gone(grpc::InsecureServerCredentials());
    address = gone.address;
  }
  const grpc::Status status = Call(address, {});
  ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  const std::string hint = ErrorHint(status, address, {});
  EXPECT_THAT(hint, HasSubstr("nothing listens at " + address));
  EXPECT_THAT(hint, HasSubstr("muonps-coordinator --port PORT --insecure"));
}

TEST(ErrorHintTest, PlaintextToATlsCoordinatorNamesTheMissingCa) {
  Server tls(TlsServerCredentials());
  const grpc::Status status = Call(tls.address, {});
  ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
  EXPECT_THAT(ErrorHint(status, tls.address, {}),
              HasSubstr("export MUONPS_TLS_CA_FILE=FILE"));
}

TEST(ErrorHintTest, TlsToAPlaintextCoordinatorAsksWhetherItServesTls) {
  Server plain(grpc::InsecureServerCredentials());
  const grpc::Status status =
      Call(plain.address, {.tls_ca_file = TlsFile("ca.pem")});
  ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
  EXPECT_THAT(ErrorHint(status, plain.address, {.tls = true}),
              HasSubstr("does the coordinator serve TLS"));
}

TEST(ErrorHintTest, AnAddressWithoutPortIsNamedAsSuch) {
  const grpc::Status status = Call("nohost", {});
  ASSERT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ErrorHint(status, "nohost", {}),
            "hint: --coordinator takes HOST:PORT; \"nohost\" has no port\n");
}

TEST(ErrorHintTest, MissingAndRefusedTokensAreNamed) {
  const grpc::Status refused(grpc::StatusCode::UNAUTHENTICATED,
                             "missing bearer token");
  EXPECT_THAT(ErrorHint(refused, "h:1", {}),
              HasSubstr("export MUONPS_TOKEN_FILE=FILE"));
  EXPECT_THAT(ErrorHint(refused, "h:1", {.token = true}),
              HasSubstr("refused this token"));
}

TEST(ErrorHintTest, FieldErrorsNeedNoHint) {
  EXPECT_EQ(
      ErrorHint(grpc::Status(grpc::StatusCode::NOT_FOUND, "job"), "h:1", {}),
      "");
}

}  // namespace
}  // namespace cli
}  // namespace muonps
