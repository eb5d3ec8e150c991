#include "server/worker/local_listener.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace muonps {
namespace worker {
namespace {

constexpr uid_t kNobody = 65534;
constexpr gid_t kTrainerGroup = 4242;  // a group no one else uses

// A fresh directory for one test, removed with what is in it.
class ScratchDir {
 public:
  ScratchDir() {
    // Not TEST_TMPDIR: Bazel's is too long for a Unix socket path.
    std::string pattern = "/tmp/muonps-listener-test-XXXXXX";
    path_ = mkdtemp(pattern.data());
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int ConnectTo(const std::string& path) {
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The listener's accept callback: greets the peer with one byte, so that
// a peer that reads it knows it was let in (a refused one reads EOF).
void Greet(int fd) {
  const char hello = 'k';
  (void)!write(fd, &hello, 1);
  close(fd);
}

// Forks a child that becomes uid nobody with `groups`, connects to `path`
// and exits 0 when greeted, 1 when refused (EOF), 2 when it cannot
// connect, 3 when it cannot drop privileges. Only async-signal-safe calls
// in the child.
int ConnectAsNobody(const std::string& path, std::vector<gid_t> groups) {
  const pid_t child = fork();
  if (child == 0) {
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(kNobody) != 0 ||
        setuid(kNobody) != 0) {
      _exit(3);
    }
    const int fd = ConnectTo(path);
    if (fd < 0) _exit(2);
    char byte = 0;
    _exit(read(fd, &byte, 1) == 1 && byte == 'k' ? 0 : 1);
  }
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// True when this process may become uid nobody (root, outside a user
// namespace that maps only root, as Bazel's sandbox does).
bool CanBecomeNobody() {
  if (getuid() != 0) return false;
  const pid_t child = fork();
  if (child == 0) _exit(setgid(kNobody) == 0 && setuid(kNobody) == 0 ? 0 : 1);
  int status = 0;
  waitpid(child, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// A listener in an open directory (mode 0777, socket 0666), so that only
// the SO_PEERCRED check stands between another uid and the worker.
std::unique_ptr<LocalListener> OpenListener(const ScratchDir& dir,
                                            PeerPolicy policy) {
  chmod(dir.path().c_str(), 0777);
  const std::string path = dir.path() + "/w.sock";
  absl::StatusOr<std::unique_ptr<LocalListener>> listener =
      LocalListener::Bind({.path = path, .policy = policy});
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return nullptr;
  chmod(path.c_str(), 0666);
  (*listener)->Start(Greet);
  return *std::move(listener);
}

TEST(CheckPeerTest, AllowsTheOwnUidAndTheAllowedGroupOnly) {
  const PeerPolicy own{.allowed_uid = 1000};
  EXPECT_TRUE(CheckPeer({.pid = 7, .uid = 1000, .gid = 1000}, own).ok());
  const absl::Status refused =
      CheckPeer({.pid = 7, .uid = 1001, .gid = 1001}, own);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.message().find("pid 7 uid 1001"), std::string::npos)
      << refused;
  const PeerPolicy group{.allowed_uid = 1000, .allowed_group = 50};
  EXPECT_TRUE(CheckPeer({.pid = 7, .uid = 1001, .gid = 50}, group).ok());
  EXPECT_TRUE(
      CheckPeer({.pid = 7, .uid = 1001, .gid = 1001, .groups = {3, 50}}, group)
          .ok());
  EXPECT_FALSE(
      CheckPeer({.pid = 7, .uid = 1001, .gid = 1001, .groups = {3}}, group)
          .ok());
}

TEST(GetPeerCredentialsTest, ReportsThisProcessOnASocketPair) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(pair[0]);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->pid, getpid());
  EXPECT_EQ(peer->uid, getuid());
  EXPECT_EQ(peer->gid, getgid());
  close(pair[0]);
  close(pair[1]);
}

TEST(LocalListenerTest, AcceptsItsOwnUid) {
  ScratchDir dir;
  std::unique_ptr<LocalListener> listener =
      OpenListener(dir, {.allowed_uid = getuid()});
  ASSERT_NE(listener, nullptr);
  const int fd = ConnectTo(listener->path());
  ASSERT_GE(fd, 0);
  char byte = 0;
  EXPECT_EQ(read(fd, &byte, 1), 1);
  EXPECT_EQ(byte, 'k');
  close(fd);
}

TEST(LocalListenerTest, RefusesAnotherUidAndLetsInTheAllowedGroup) {
  if (!CanBecomeNobody()) GTEST_SKIP() << "needs root to become another uid";
  ScratchDir dir;
  {
    std::unique_ptr<LocalListener> listener =
        OpenListener(dir, {.allowed_uid = getuid()});
    ASSERT_NE(listener, nullptr);
    EXPECT_EQ(ConnectAsNobody(listener->path(), {}), 1);
    EXPECT_EQ(ConnectAsNobody(listener->path(), {kTrainerGroup}), 1);
  }
  std::unique_ptr<LocalListener> listener = OpenListener(
      dir, {.allowed_uid = getuid(), .allowed_group = kTrainerGroup});
  ASSERT_NE(listener, nullptr);
  EXPECT_EQ(ConnectAsNobody(listener->path(), {kTrainerGroup}), 0);
  EXPECT_EQ(ConnectAsNobody(listener->path(), {}), 1);
}

TEST(LocalListenerTest, PrivateDirectoryKeepsOtherUsersFromConnecting) {
  if (!CanBecomeNobody()) GTEST_SKIP() << "needs root to become another uid";
  ScratchDir scratch;
  const std::string dir = scratch.path() + "/muonps";
  chmod(scratch.path().c_str(), 0755);
  ASSERT_TRUE(PreparePrivateDirectory(dir, getuid(), std::nullopt).ok());
  absl::StatusOr<std::unique_ptr<LocalListener>> listener = LocalListener::Bind(
      {.path = dir + "/w.sock", .policy = {.allowed_uid = getuid()}});
  ASSERT_TRUE(listener.ok()) << listener.status();
  (*listener)->Start(Greet);
  struct stat info;
  ASSERT_EQ(stat((dir + "/w.sock").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  EXPECT_EQ(ConnectAsNobody((*listener)->path(), {}), 2);
}

TEST(PreparePrivateDirectoryTest, CreatesMode0700AndAcceptsItAgain) {
  ScratchDir scratch;
  const std::string dir = scratch.path() + "/muonps";
  const mode_t old_umask = umask(0);
  ASSERT_TRUE(PreparePrivateDirectory(dir, getuid(), std::nullopt).ok());
  umask(old_umask);
  struct stat info;
  ASSERT_EQ(lstat(dir.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0700u);
  EXPECT_TRUE(PreparePrivateDirectory(dir, getuid(), std::nullopt).ok());
}

TEST(PreparePrivateDirectoryTest, RefusesAnOpenDirectoryNamingIt) {
  ScratchDir scratch;
  const std::string dir = scratch.path() + "/muonps";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  const absl::Status status =
      PreparePrivateDirectory(dir, getuid(), std::nullopt);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find(dir), std::string::npos) << status;
  EXPECT_NE(status.message().find("0755"), std::string::npos) << status;
}

TEST(PreparePrivateDirectoryTest, RefusesASymlinkToAPrivateDirectory) {
  ScratchDir scratch;
  const std::string real = scratch.path() + "/real";
  const std::string link = scratch.path() + "/muonps";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  const absl::Status status =
      PreparePrivateDirectory(link, getuid(), std::nullopt);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("symlink"), std::string::npos) << status;
}

TEST(PreparePrivateDirectoryTest, RefusesADirectoryOfAnotherUser) {
  if (!CanBecomeNobody()) GTEST_SKIP() << "needs root to chown";
  ScratchDir scratch;
  const std::string dir = scratch.path() + "/muonps";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chown(dir.c_str(), kNobody, kNobody), 0);
  const absl::Status status =
      PreparePrivateDirectory(dir, getuid(), std::nullopt);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("owned by uid 65534"), std::string::npos)
      << status;
}

TEST(PreparePrivateDirectoryTest, GroupMayTraverseWhenAllowed) {
  ScratchDir scratch;
  const std::string dir = scratch.path() + "/muonps";
  ASSERT_TRUE(PreparePrivateDirectory(dir, getuid(), getgid()).ok());
  struct stat info;
  ASSERT_EQ(lstat(dir.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 07777, 0710u);
  EXPECT_FALSE(PreparePrivateDirectory(dir, getuid(), std::nullopt).ok());
}

TEST(LocalListenerTest, ReplacesAStaleSocketAndRefusesALiveOne) {
  ScratchDir dir;
  const std::string path = dir.path() + "/w.sock";
  {
    // A dead worker's socket: bound, then closed without unlinking.
    sockaddr_un address = {};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)),
              0);
    close(fd);
  }
  absl::StatusOr<std::unique_ptr<LocalListener>> first =
      LocalListener::Bind({.path = path, .policy = {.allowed_uid = getuid()}});
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<LocalListener>> second =
      LocalListener::Bind({.path = path, .policy = {.allowed_uid = getuid()}});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find(path), std::string::npos)
      << second.status();
  first->reset();
  struct stat info;
  EXPECT_NE(lstat(path.c_str(), &info), 0) << "the socket file outlived it";
}

TEST(LocalListenerTest, RefusesToReplaceAFileThatIsNotASocket) {
  ScratchDir dir;
  const std::string path = dir.path() + "/w.sock";
  std::ofstream(path).put('x');
  absl::StatusOr<std::unique_ptr<LocalListener>> listener =
      LocalListener::Bind({.path = path, .policy = {.allowed_uid = getuid()}});
  EXPECT_EQ(listener.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(DefaultSocketPathTest, PrefersXdgRuntimeDir) {
  EXPECT_EQ(DefaultSocketPath("w0", "/run/user/1000", 1000),
            "/run/user/1000/muonps/worker-w0.sock");
  EXPECT_EQ(DefaultSocketPath("w0", "", 1000),
            "/tmp/muonps-1000/worker-w0.sock");
}

}  // namespace
}  // namespace worker
}  // namespace muonps
