#include "tests/harness/network_namespace.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace testing {
namespace {

constexpr int kSubnet = 76;

// A TCP listener on `address`, port chosen by the kernel (connections
// complete in its backlog without an accept).
class Listener {
 public:
  explicit Listener(const std::string& address) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    inet_pton(AF_INET, address.c_str(), &sa.sin_addr);
    if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
        listen(fd_, 16) != 0) {
      return;
    }
    socklen_t len = sizeof(sa);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
    port_ = ntohs(sa.sin_port);
  }
  ~Listener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Whether a process inside `ns` connects to host:port within a second.
bool ConnectsFromInside(const NetworkNamespace& ns, int port) {
  const std::vector<std::string> argv = ns.Wrap(
      {"timeout", "1", "bash", "-c",
       absl::StrCat("exec 3<>/dev/tcp/", ns.host_address(), "/", port)});
  return RunCommand(argv).ok();
}

TEST(NetworkNamespaceTest, PartitionCutsTcpExceptOpenPortsAndHealRestores) {
  auto created = NetworkNamespace::Create(kSubnet);
  if (absl::IsFailedPrecondition(created.status())) {
    GTEST_SKIP() << created.status();
  }
  ASSERT_TRUE(created.ok()) << created.status();
  NetworkNamespace& ns = **created;
  EXPECT_EQ(ns.host_address(), "10.231.76.1");
  EXPECT_EQ(ns.inside_address(), "10.231.76.2");
  Listener open(ns.host_address());
  Listener cut(ns.host_address());
  ASSERT_GT(open.port(), 0);
  ASSERT_GT(cut.port(), 0);
  EXPECT_TRUE(ConnectsFromInside(ns, open.port()));
  EXPECT_TRUE(ConnectsFromInside(ns, cut.port()));

  const absl::Status cut_status = ns.Partition({open.port()});
  ASSERT_TRUE(cut_status.ok()) << cut_status;
  EXPECT_TRUE(ConnectsFromInside(ns, open.port()));
  EXPECT_FALSE(ConnectsFromInside(ns, cut.port()));

  const absl::Status healed = ns.Heal();
  ASSERT_TRUE(healed.ok()) << healed;
  EXPECT_TRUE(ConnectsFromInside(ns, cut.port()));
}

TEST(NetworkNamespaceTest, DestroyRemovesTheNamespaceAndLink) {
  {
    auto created = NetworkNamespace::Create(kSubnet);
    if (absl::IsFailedPrecondition(created.status())) {
      GTEST_SKIP() << created.status();
    }
    ASSERT_TRUE(created.ok()) << created.status();
  }
  EXPECT_FALSE(RunCommand({"ip", "link", "show", "mpsh76"}).ok());
  EXPECT_FALSE(
      RunCommand({"ip", "netns", "exec", "muonps-test-76", "true"}).ok());
}

TEST(NetworkNamespaceTest, RefusesASubnetOutOfRange) {
  EXPECT_TRUE(absl::IsInvalidArgument(NetworkNamespace::Create(256).status()));
}

}  // namespace
}  // namespace testing
}  // namespace muonps
