// HostNetworkGbs on sysfs trees written as the kernel lays them out: active
// InfiniBand/RoCE ports summed, down ones skipped, else the fastest
// physical Ethernet interface that is up, nothing found: 0.
#include "common/network_links.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace muonps {
namespace {

namespace fs = std::filesystem;

class HostNetworkGbsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = fs::path(tmp != nullptr ? tmp : "/tmp") /
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void Write(const std::string& relative, const std::string& line) {
    const fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << line << "\n";
  }
  // An RDMA port: class/infiniband/<device>/ports/<port>.
  void Port(const std::string& device, int port, const std::string& state,
            const std::string& rate) {
    const std::string at =
        "class/infiniband/" + device + "/ports/" + std::to_string(port);
    Write(at + "/state", state);
    Write(at + "/rate", rate);
  }
  // An interface: class/net/<name>, physical when it has a device link.
  void Interface(const std::string& name, bool physical,
                 const std::string& operstate, const std::string& speed) {
    Write("class/net/" + name + "/operstate", operstate);
    Write("class/net/" + name + "/speed", speed);
    if (physical) {
      fs::create_directories(root_ / "devices" / name);
      fs::create_directory_symlink(root_ / "devices" / name,
                                   root_ / "class/net" / name / "device");
    }
  }
  fs::path root_;
};

TEST_F(HostNetworkGbsTest, ActiveRdmaPortsAreSummed) {
  for (int d = 0; d < 8; ++d) {
    Port("mlx5_" + std::to_string(d), 1, "4: ACTIVE", "400 Gb/sec (4X NDR)");
  }
  Port("mlx5_8", 1, "1: DOWN", "400 Gb/sec (4X NDR)");
  Interface("eth0", true, "up", "100000");
  // 8 x 400 Gb/s = 400 GB/s; the down port and Ethernet do not count.
  EXPECT_DOUBLE_EQ(HostNetworkGbs(root_.string()), 400);
}

TEST_F(HostNetworkGbsTest, WithoutRdmaTheFastestPhysicalInterfaceThatIsUp) {
  Port("mlx5_0", 1, "1: DOWN", "200 Gb/sec (4X HDR)");
  Interface("lo", false, "unknown", "");
  Interface("docker0", false, "up", "10000");
  Interface("eth0", true, "up", "25000");
  Interface("eth1", true, "up", "100000");
  Interface("eth2", true, "down", "400000");
  EXPECT_DOUBLE_EQ(HostNetworkGbs(root_.string()), 12.5);  // 100 Gb/s
}

TEST_F(HostNetworkGbsTest, NothingReadableIsUnknown) {
  EXPECT_EQ(HostNetworkGbs(root_.string()), 0);
  EXPECT_EQ(HostNetworkGbs((root_ / "missing").string()), 0);
  // A link whose speed the driver does not know reads -1.
  Interface("eth0", true, "up", "-1");
  EXPECT_EQ(HostNetworkGbs(root_.string()), 0);
}

}  // namespace
}  // namespace muonps
