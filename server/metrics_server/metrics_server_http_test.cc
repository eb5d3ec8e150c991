// MetricsServer on loopback over HTTP: what /metrics, /healthz and other
// paths answer, the port closing with the server, and a busy or
// out-of-range port refused.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/metrics_exposition_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics_server/metrics_server.h"

namespace muonps {
namespace {

using metrics_test::ExpositionErrors;
using metrics_test::RenderValid;
using ::testing::HasSubstr;

TEST(MetricsServerTest, ServesMetricsHealthzAnd404OnLoopback) {
  MetricsRegistry registry;
  registry.AddCounter("muonps_scrapes_total", "Scrapes.", {"job"})
      ->Increment({"j\"1"}, 3);
  registry.AddHistogram("muonps_step_seconds", "Steps.")->Observe(0.003);
  auto server = MetricsServer::Start(&registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_connection_timeout(5);
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->get_header_value("Content-Type"),
            "text/plain; version=0.0.4");
  EXPECT_EQ(metrics->body, RenderValid(registry));
  EXPECT_EQ(ExpositionErrors(metrics->body), "");

  httplib::Result health = client.Get("/healthz");
  ASSERT_TRUE(health) << httplib::to_string(health.error());
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(health->body, "ok");

  httplib::Result missing = client.Get("/nope");
  ASSERT_TRUE(missing) << httplib::to_string(missing.error());
  EXPECT_EQ(missing->status, 404);
}

TEST(MetricsServerTest, DestroyingServerClosesPort) {
  MetricsRegistry registry;
  auto server = MetricsServer::Start(&registry, "127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  ASSERT_TRUE(client.Get("/healthz"));
  server->reset();
  httplib::Result after = client.Get("/healthz");
  EXPECT_FALSE(after);
  EXPECT_EQ(after.error(), httplib::Error::Connection);
}

TEST(MetricsServerTest, BusyPortIsUnavailableNamingHostAndPort) {
  // A plain listening socket without SO_REUSEPORT keeps the port busy.
  const int busy = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(busy, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(busy, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(busy, 1), 0);
  ASSERT_EQ(getsockname(busy, reinterpret_cast<sockaddr*>(&address), &length),
            0);
  const int port = ntohs(address.sin_port);

  MetricsRegistry registry;
  auto server = MetricsServer::Start(&registry, "127.0.0.1", port);
  close(busy);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr(absl::StrCat("127.0.0.1:", port)));
}

TEST(MetricsServerTest, PortOutOfRangeIsInvalidArgument) {
  MetricsRegistry registry;
  auto server = MetricsServer::Start(&registry, "127.0.0.1", 70000);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace muonps
