#include "server/worker/local_listener.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

absl::Status SystemError(absl::string_view call, absl::string_view path,
                         int error) {
  return absl::InternalError(
      absl::StrCat(call, "(", Quoted(path), "): ", std::strerror(error)));
}

absl::StatusOr<sockaddr_un> UnixAddress(const std::string& path) {
  sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return InvalidField(
        "socket", absl::StrCat(Quoted(path), " is not 1 to ",
                               sizeof(address.sun_path) - 1,
                               " bytes long, as a Unix socket path must be"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

// True when a process accepts connections on the socket at `address`.
bool SomeoneListens(const sockaddr_un& address) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  const int result =
      connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  // EAGAIN: a listener whose backlog is full is still alive.
  const bool live = result == 0 || errno == EAGAIN || errno == EINPROGRESS;
  close(fd);
  return live;
}

// Removes a socket file left by a dead process at `path`; refuses a live
// one and anything that is not a socket.
absl::Status ClearStaleSocket(const std::string& path,
                              const sockaddr_un& address) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return SystemError("lstat", path, errno);
  }
  if (!S_ISSOCK(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("socket path ", Quoted(path),
                     " exists and is not a socket; refusing to replace it"));
  }
  if (SomeoneListens(address)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "socket ", Quoted(path),
        " is served by a live process (another worker with this id?)"));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return SystemError("unlink", path, errno);
  }
  spdlog::info("replaced the stale socket {} of a stopped process", path);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd) {
  ucred cred = {};
  socklen_t length = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return absl::InternalError(
        absl::StrCat("getsockopt(SO_PEERCRED): ", std::strerror(errno)));
  }
  PeerCredentials peer{.pid = cred.pid, .uid = cred.uid, .gid = cred.gid};
  // SO_PEERGROUPS reports the supplementary groups (Linux 4.13+): ask with
  // a guess, then with the size the kernel says it needs.
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    length = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &length) ==
        0) {
      groups.resize(length / sizeof(gid_t));
      peer.groups = std::move(groups);
      return peer;
    }
    if (errno != ERANGE) break;
    groups.resize(length / sizeof(gid_t));
  }
  return peer;  // no supplementary groups known: only the primary gid counts
}

absl::Status CheckPeer(const PeerCredentials& peer, const PeerPolicy& policy) {
  if (peer.uid == policy.allowed_uid) return absl::OkStatus();
  if (policy.allowed_group.has_value()) {
    const gid_t group = *policy.allowed_group;
    if (peer.gid == group || std::find(peer.groups.begin(), peer.groups.end(),
                                       group) != peer.groups.end()) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(
      absl::StrCat("peer pid ", peer.pid, " uid ", peer.uid, " gid ", peer.gid,
                   " is not uid ", policy.allowed_uid,
                   policy.allowed_group.has_value()
                       ? absl::StrCat(" nor in group ", *policy.allowed_group)
                       : std::string()));
}

absl::StatusOr<gid_t> GroupId(const std::string& name) {
  std::vector<char> buffer(16384);
  group entry;
  group* found = nullptr;
  const int error =
      getgrnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (error != 0 || found == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "group ", Quoted(name), " does not exist",
        error != 0 ? absl::StrCat(": ", std::strerror(error)) : ""));
  }
  return found->gr_gid;
}

std::string DefaultSocketPath(const std::string& worker_id,
                              const std::string& xdg_runtime_dir, uid_t uid) {
  const std::string name = absl::StrCat("worker-", worker_id, ".sock");
  if (!xdg_runtime_dir.empty()) {
    return absl::StrCat(xdg_runtime_dir, "/muonps/", name);
  }
  return absl::StrCat("/tmp/muonps-", uid, "/", name);
}

absl::Status PreparePrivateDirectory(const std::string& dir, uid_t owner,
                                     std::optional<gid_t> group) {
  const mode_t mode = group.has_value() ? 0710 : 0700;
  if (mkdir(dir.c_str(), mode) == 0) {
    // mkdir's mode passes through the umask: set it exactly.
    if (group.has_value() && chown(dir.c_str(), owner, *group) != 0) {
      return SystemError("chown", dir, errno);
    }
    if (chmod(dir.c_str(), mode) != 0) return SystemError("chmod", dir, errno);
  } else if (errno != EEXIST) {
    return SystemError("mkdir", dir, errno);
  }
  struct stat info;
  if (lstat(dir.c_str(), &info) != 0) return SystemError("lstat", dir, errno);
  const std::string what = absl::StrCat("socket directory ", Quoted(dir));
  if (S_ISLNK(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is a symlink; use a real directory"));
  }
  if (!S_ISDIR(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " exists and is not a directory"));
  }
  if (info.st_uid != owner) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " is owned by uid ", info.st_uid, ", not by uid ",
                     owner, " (this worker's user)"));
  }
  mode_t open_bits = info.st_mode & 077;
  if (group.has_value() && info.st_gid == *group) open_bits &= ~mode_t{010};
  if (open_bits != 0) {
    char octal[8];
    std::snprintf(octal, sizeof(octal), "%04o", info.st_mode & 07777);
    return absl::FailedPreconditionError(absl::StrCat(
        what, " has mode ", octal,
        ": other users could reach the socket; make it 0700 (chmod 700)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalListener>> LocalListener::Bind(
    LocalListenerOptions options) {
  const std::string& path = options.path;
  MUONPS_ASSIGN_OR_RETURN(const sockaddr_un address, UnixAddress(path));
  MUONPS_RETURN_IF_ERROR(ClearStaleSocket(path, address));
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return SystemError("socket", path, errno);
  // Under umask 077 no other user can connect even before the chmod.
  const mode_t old_umask = umask(077);
  const int bound =
      bind(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  const int bind_error = errno;
  umask(old_umask);
  absl::Status status;
  const std::optional<gid_t> group = options.policy.allowed_group;
  if (bound != 0) {
    status = bind_error == EADDRINUSE
                 ? absl::AlreadyExistsError(absl::StrCat(
                       "socket ", Quoted(path), " was created meanwhile"))
                 : SystemError("bind", path, bind_error);
  } else if (group.has_value() && chown(path.c_str(), -1, *group) != 0) {
    status = SystemError("chown", path, errno);
  } else if (chmod(path.c_str(), group.has_value() ? 0660 : 0600) != 0) {
    status = SystemError("chmod", path, errno);
  } else if (listen(fd, SOMAXCONN) != 0) {
    status = SystemError("listen", path, errno);
  }
  int wake[2] = {-1, -1};
  if (status.ok() && pipe2(wake, O_CLOEXEC) != 0) {
    status = SystemError("pipe2", path, errno);
  }
  if (!status.ok()) {
    close(fd);
    if (bound == 0) unlink(path.c_str());
    return status;
  }
  return std::unique_ptr<LocalListener>(
      new LocalListener(std::move(options), fd, wake[0], wake[1]));
}

LocalListener::LocalListener(LocalListenerOptions options, int fd,
                             int wake_read, int wake_write)
    : options_(std::move(options)),
      fd_(fd),
      wake_read_(wake_read),
      wake_write_(wake_write) {}

LocalListener::~LocalListener() {
  if (thread_.joinable()) {
    const char stop = 0;
    while (write(wake_write_, &stop, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  close(fd_);
  close(wake_read_);
  close(wake_write_);
  unlink(options_.path.c_str());
}

void LocalListener::Start(AcceptFn accept) {
  thread_ =
      std::thread([this, accept = std::move(accept)] { AcceptLoop(accept); });
}

void LocalListener::AcceptLoop(AcceptFn accept) {
  while (true) {
    pollfd waits[2] = {{fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    if (poll(waits, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("socket {}: poll: {}", options_.path, std::strerror(errno));
      return;
    }
    if (waits[1].revents != 0) return;
    if (waits[0].revents == 0) continue;
    const int connection =
        accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (connection < 0) {
      // The peer gave up between poll and accept, or a transient shortage.
      if (errno != EAGAIN && errno != ECONNABORTED && errno != EINTR) {
        spdlog::warn("socket {}: accept: {}", options_.path,
                     std::strerror(errno));
      }
      continue;
    }
    absl::StatusOr<PeerCredentials> peer = GetPeerCredentials(connection);
    const absl::Status allowed =
        peer.ok() ? CheckPeer(*peer, options_.policy) : peer.status();
    if (!allowed.ok()) {
      spdlog::warn("socket {}: refused a connection: {}", options_.path,
                   allowed.ToString());
      close(connection);
      continue;
    }
    accept(connection);
  }
}

absl::StatusOr<std::unique_ptr<LocalListener>> OpenWorkerSocket(
    const std::string& socket_flag, const std::string& worker_id,
    std::optional<gid_t> allowed_group) {
  const uid_t uid = geteuid();
  std::string path = socket_flag;
  if (path.empty()) {
    const char* runtime = std::getenv("XDG_RUNTIME_DIR");
    path = DefaultSocketPath(worker_id, runtime != nullptr ? runtime : "", uid);
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  struct stat info;
  if (socket_flag.empty() || lstat(dir.c_str(), &info) != 0) {
    MUONPS_RETURN_IF_ERROR(PreparePrivateDirectory(dir, uid, allowed_group));
  }
  return LocalListener::Bind(
      {.path = path,
       .policy = {.allowed_uid = uid, .allowed_group = allowed_group}});
}

}  // namespace worker
}  // namespace muonps
