// The /metrics endpoint's address, bearer-token and TLS rules.
#include "server/metrics_server/metrics_server.h"

#include <httplib.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace muonps {
namespace {

constexpr char kToken[] = "s3cret-token-value";

// A directory with a token file (and, on request, a self-signed
// certificate), removed with the test.
class Secrets {
 public:
  Secrets() {
    std::string pattern = "/tmp/muonps-metrics-test-XXXXXX";
    dir_ = mkdtemp(pattern.data());
    std::ofstream(token_file()) << kToken << "\n";
  }
  ~Secrets() { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string token_file() const { return dir_ + "/token"; }
  std::string cert() const { return dir_ + "/cert.pem"; }
  std::string key() const { return dir_ + "/key.pem"; }
  // False when no openssl command is there to make one.
  bool MakeCertificate() const {
    const std::string command =
        "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "
        "/CN=127.0.0.1 -keyout '" +
        key() + "' -out '" + cert() + "' >/dev/null 2>&1";
    return std::system(command.c_str()) == 0;
  }

 private:
  std::string dir_;
};

TEST(MetricsServerOptionsTest, NonLoopbackAddressWithoutTokenIsRefused) {
  unsetenv("MUONPS_METRICS_TOKEN_FILE");
  auto options = MetricsServerOptionsFromFlags("0.0.0.0:9090", 0, "", "", "");
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("--metrics_address"),
            std::string::npos)
      << options.status();
  MetricsRegistry registry;
  MetricsServerOptions direct;
  direct.host = "0.0.0.0";
  EXPECT_EQ(MetricsServer::Start(&registry, direct).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MetricsServerOptionsTest, ReadsAddressPortOverrideTokenAndDisable) {
  Secrets secrets;
  auto loopback =
      MetricsServerOptionsFromFlags("127.0.0.1:0", 9123, "", "", "");
  ASSERT_TRUE(loopback.ok()) << loopback.status();
  ASSERT_TRUE(loopback->has_value());
  EXPECT_EQ((*loopback)->host, "127.0.0.1");
  EXPECT_EQ((*loopback)->port, 9123);
  EXPECT_EQ((*loopback)->bearer_token, "");

  auto open = MetricsServerOptionsFromFlags("[::]:9090", 0,
                                            secrets.token_file(), "", "");
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_EQ((*open)->host, "::");
  EXPECT_EQ((*open)->port, 9090);
  EXPECT_EQ((*open)->bearer_token, kToken);

  setenv("MUONPS_METRICS_TOKEN_FILE", secrets.token_file().c_str(), 1);
  auto from_env = MetricsServerOptionsFromFlags("10.0.0.1:1", 0, "", "", "");
  unsetenv("MUONPS_METRICS_TOKEN_FILE");
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ((*from_env)->bearer_token, kToken);

  auto disabled = MetricsServerOptionsFromFlags("127.0.0.1:0", -1, "", "", "");
  ASSERT_TRUE(disabled.ok());
  EXPECT_FALSE(disabled->has_value());

  EXPECT_FALSE(MetricsServerOptionsFromFlags("9090", 0, "", "", "").ok());
  EXPECT_FALSE(
      MetricsServerOptionsFromFlags("127.0.0.1:70000", 0, "", "", "").ok());
  EXPECT_EQ(
      MetricsServerOptionsFromFlags("0.0.0.0:0", 0, "/no/such/token", "", "")
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(
      MetricsServerOptionsFromFlags("127.0.0.1:0", 0, "", secrets.cert(), "")
          .ok());
}

TEST(MetricsServerOptionsTest, OnlyLoopbackHostsGoWithoutAToken) {
  unsetenv("MUONPS_METRICS_TOKEN_FILE");
  for (const char* address :
       {"127.0.0.1:0", "127.8.9.10:0", "[::1]:0", "localhost:0"}) {
    EXPECT_TRUE(MetricsServerOptionsFromFlags(address, 0, "", "", "").ok())
        << address;
  }
  for (const char* address :
       {"0.0.0.0:0", "[::]:0", "10.1.2.3:0", "128.0.0.1:0", "example.com:0"}) {
    EXPECT_FALSE(MetricsServerOptionsFromFlags(address, 0, "", "", "").ok())
        << address;
  }
}

TEST(MetricsServerTest, TokenGuardsEveryPath401WithoutOrWrongAnd200WithIt) {
  Secrets secrets;
  auto options = MetricsServerOptionsFromFlags("0.0.0.0:0", 0,
                                               secrets.token_file(), "", "");
  ASSERT_TRUE(options.ok()) << options.status();
  MetricsRegistry registry;
  registry.AddCounter("muonps_scrapes_total", "Scrapes.")->Increment({}, 2);
  auto server = MetricsServer::Start(&registry, **options);
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(5);
  for (const char* path : {"/metrics", "/healthz"}) {
    httplib::Result none = client.Get(path);
    ASSERT_TRUE(none) << httplib::to_string(none.error());
    EXPECT_EQ(none->status, 401) << path;
    EXPECT_EQ(none->body.find("scrapes"), std::string::npos);
    for (const char* wrong :
         {"Bearer s3cret-token-valuX", "Bearer s3cret", "Basic s3cret",
          "Bearer s3cret-token-value-and-more", "s3cret-token-value"}) {
      httplib::Result bad = client.Get(path, {{"Authorization", wrong}});
      ASSERT_TRUE(bad);
      EXPECT_EQ(bad->status, 401) << path << " " << wrong;
    }
  }
  const httplib::Headers good = {
      {"Authorization", std::string("Bearer ") + kToken}};
  httplib::Result metrics = client.Get("/metrics", good);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("muonps_scrapes_total 2"), std::string::npos)
      << metrics->body;
}

TEST(MetricsServerTest, ServesHttpsWithCertificateAndKey) {
  Secrets secrets;
  if (!secrets.MakeCertificate()) GTEST_SKIP() << "no openssl command";
  auto options = MetricsServerOptionsFromFlags(
      "0.0.0.0:0", 0, secrets.token_file(), secrets.cert(), secrets.key());
  ASSERT_TRUE(options.ok()) << options.status();
  MetricsRegistry registry;
  auto server = MetricsServer::Start(&registry, **options);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->url().rfind("https://", 0), 0u) << (*server)->url();
  httplib::SSLClient client("127.0.0.1", (*server)->port());
  client.set_ca_cert_path(secrets.cert().c_str());
  client.enable_server_certificate_verification(true);
  client.set_connection_timeout(5);
  httplib::Result none = client.Get("/metrics");
  ASSERT_TRUE(none) << httplib::to_string(none.error());
  EXPECT_EQ(none->status, 401);
  httplib::Result good = client.Get(
      "/healthz", {{"Authorization", std::string("Bearer ") + kToken}});
  ASSERT_TRUE(good) << httplib::to_string(good.error());
  EXPECT_EQ(good->status, 200);
  EXPECT_EQ(good->body, "ok");
  // Plain HTTP on the TLS port gets nothing useful.
  httplib::Client plain("127.0.0.1", (*server)->port());
  plain.set_connection_timeout(2);
  plain.set_read_timeout(2);
  httplib::Result cleartext = plain.Get(
      "/healthz", {{"Authorization", std::string("Bearer ") + kToken}});
  EXPECT_TRUE(!cleartext || cleartext->status != 200);
}

TEST(MetricsServerTest, UnloadableCertificateIsRefusedNamingIt) {
  Secrets secrets;
  MetricsServerOptions options;
  options.tls_cert_file = secrets.cert();  // never written
  options.tls_key_file = secrets.key();
  MetricsRegistry registry;
  auto server = MetricsServer::Start(&registry, options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(server.status().message().find(secrets.cert()), std::string::npos)
      << server.status();
}

}  // namespace
}  // namespace muonps
