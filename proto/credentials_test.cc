#include "proto/credentials.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "muonps/v1/coordinator.grpc.pb.h"

namespace muonps {
namespace {

std::string TlsFile(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/",
                      std::getenv("TEST_WORKSPACE"), "/tests/testdata/tls/",
                      name);
}

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::ofstream(path) << contents;
  return path;
}

TEST(ReadTokenTest, TakesTheFirstLineTrimmed) {
  const std::string path =
      WriteTemp("token", "  0123456789abcdef0123  \nsecond line\n");
  absl::StatusOr<std::string> token = ReadToken(path, "--token_file");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "0123456789abcdef0123");
}

TEST(ReadTokenTest, RefusesShortSpacedMissingAndEmptyTokensNamingTheFlag) {
  for (const std::string& contents :
       {std::string("short"), std::string("0123456789 abcdef0123"),
        std::string("")}) {
    absl::StatusOr<std::string> token =
        ReadToken(WriteTemp("bad", contents), "--token_file");
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(token.status().message().find("--token_file"), std::string::npos);
  }
  EXPECT_EQ(ReadToken("/nonexistent/token", "--token_file").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LoadServerSecurityTest, PlaintextNeedsInsecureAndLoopback) {
  absl::StatusOr<ServerSecurity> refused = LoadServerSecurity({}, "127.0.0.1");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("--insecure"), std::string::npos);

  absl::StatusOr<ServerSecurity> allowed =
      LoadServerSecurity({.insecure = true}, "127.0.0.1");
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_FALSE(allowed->tls);

  absl::StatusOr<ServerSecurity> exposed =
      LoadServerSecurity({.insecure = true}, "0.0.0.0");
  EXPECT_EQ(exposed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(exposed.status().message().find("not loopback"), std::string::npos);
}

TEST(LoadServerSecurityTest, NonLoopbackNeedsTlsAndToken) {
  SecurityConfig tls{.tls_cert_file = TlsFile("server.pem"),
                     .tls_key_file = TlsFile("server.key")};
  EXPECT_EQ(LoadServerSecurity(tls, "0.0.0.0").status().code(),
            absl::StatusCode::kFailedPrecondition);
  tls.token_file = TlsFile("token");
  absl::StatusOr<ServerSecurity> ok = LoadServerSecurity(tls, "0.0.0.0");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->tls);
  EXPECT_GE(ok->token.size(), 16u);
}

TEST(LoadServerSecurityTest, CertificateWithoutKeyIsRefused) {
  absl::StatusOr<ServerSecurity> refused =
      LoadServerSecurity({.tls_cert_file = TlsFile("server.pem")}, "127.0.0.1");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--tls_key_file"),
            std::string::npos);
}

// A Coordinator whose ListJobs checks the token as the real services do.
class GuardedService final : public v1::Coordinator::Service {
 public:
  explicit GuardedService(std::string token) : token_(std::move(token)) {}
  grpc::Status ListJobs(grpc::ServerContext* context,
                        const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override {
    const absl::Status status = CheckBearerToken(*context, token_);
    if (!status.ok()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          std::string(status.message()));
    }
    return grpc::Status::OK;
  }

 private:
  const std::string token_;
};

struct Served {
  std::unique_ptr<GuardedService> service;
  std::unique_ptr<grpc::Server> server;
  std::string target;
};

Served Serve(const SecurityConfig& config) {
  absl::StatusOr<ServerSecurity> security =
      LoadServerSecurity(config, "127.0.0.1");
  EXPECT_TRUE(security.ok()) << security.status();
  Served out;
  out.service = std::make_unique<GuardedService>(security->token);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", security->credentials, &port);
  builder.RegisterService(out.service.get());
  out.server = builder.BuildAndStart();
  out.target = absl::StrCat("127.0.0.1:", port);
  return out;
}

grpc::StatusCode Call(const std::string& target, const SecurityConfig& config) {
  grpc::ChannelArguments args;
  // The test certificate names 127.0.0.1; gRPC checks the target's host.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      OpenChannel(target, config, args);
  EXPECT_TRUE(channel.ok()) << channel.status();
  auto stub = v1::Coordinator::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  v1::ListJobsResponse response;
  return stub->ListJobs(&context, {}, &response).error_code();
}

TEST(CredentialsEndToEndTest, TlsWithTokenAcceptsOnlyTheRightToken) {
  Served served = Serve({.token_file = TlsFile("token"),
                         .tls_cert_file = TlsFile("server.pem"),
                         .tls_key_file = TlsFile("server.key")});
  const std::string ca = TlsFile("ca.pem");
  EXPECT_EQ(
      Call(served.target, {.token_file = TlsFile("token"), .tls_ca_file = ca}),
      grpc::StatusCode::OK);
  EXPECT_EQ(Call(served.target, {.tls_ca_file = ca}),
            grpc::StatusCode::UNAUTHENTICATED);
  const std::string wrong =
      WriteTemp("wrong_token", "ffffffffffffffffffffffffffffffff\n");
  EXPECT_EQ(Call(served.target, {.token_file = wrong, .tls_ca_file = ca}),
            grpc::StatusCode::UNAUTHENTICATED);
  // Plaintext against TLS never reaches the service.
  EXPECT_EQ(Call(served.target, {.token_file = TlsFile("token")}),
            grpc::StatusCode::UNAVAILABLE);
  served.server->Shutdown();
}

TEST(CredentialsEndToEndTest, ClientRefusesAServerItsCaDidNotSign) {
  Served served = Serve({.insecure = true});
  // TLS against a plaintext server fails the handshake.
  EXPECT_EQ(Call(served.target, {.tls_ca_file = TlsFile("ca.pem")}),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Call(served.target, {}), grpc::StatusCode::OK);
  served.server->Shutdown();
}

TEST(CredentialsEndToEndTest, MutualTlsRequiresAClientCertificate) {
  Served served = Serve({.tls_cert_file = TlsFile("server.pem"),
                         .tls_key_file = TlsFile("server.key"),
                         .tls_client_ca_file = TlsFile("ca.pem")});
  EXPECT_EQ(Call(served.target, {.tls_ca_file = TlsFile("ca.pem")}),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(Call(served.target, {.tls_cert_file = TlsFile("client.pem"),
                                 .tls_key_file = TlsFile("client.key"),
                                 .tls_ca_file = TlsFile("ca.pem")}),
            grpc::StatusCode::OK);
  served.server->Shutdown();
}

}  // namespace
}  // namespace muonps
