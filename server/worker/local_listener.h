// LocalListener: the worker's Unix socket, the door through which a trainer
// on the same host lends its buffers. The worker listens and accepts itself
// (gRPC's own Unix listener does not show who connected), checks each peer's
// kernel-reported credentials (SO_PEERCRED), closes refused connections with
// a warn log naming the peer's pid and uid, and hands accepted ones to a
// callback (the gRPC server: grpc::AddInsecureChannelFromFd).
//
// Who may connect: processes running as `allowed_uid` (the worker's own
// user), or, when `allowed_group` is set, processes whose primary or
// supplementary groups include it.
//
// Where: a socket path in a private directory (PreparePrivateDirectory):
// owned by the worker's user, not a symlink, and closed to everyone else
// (mode 0700; 0710 with the allowed group as the directory's group).
//
// Thread-safety: Start() and destruction are called from one thread; the
// accept callback runs on the listener's own thread, one connection at a
// time. Not copyable.
#ifndef MUONPS_SERVER_WORKER_LOCAL_LISTENER_H_
#define MUONPS_SERVER_WORKER_LOCAL_LISTENER_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace worker {

// Who is at the other end of a connected Unix socket, as the kernel saw it
// at connect time.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups (SO_PEERGROUPS)
};

// Who the listener lets in.
struct PeerPolicy {
  uid_t allowed_uid = 0;
  std::optional<gid_t> allowed_group;
};

// The credentials of the peer of the connected Unix socket `fd`. INTERNAL
// naming the call when the kernel does not say.
absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd);

// OK when `peer` may talk to the worker under `policy`; PERMISSION_DENIED
// naming the peer's pid, uid and gid otherwise.
absl::Status CheckPeer(const PeerCredentials& peer, const PeerPolicy& policy);

// The id of the group named `name` (--allow_group). NOT_FOUND naming it
// when no such group exists.
absl::StatusOr<gid_t> GroupId(const std::string& name);

// The default socket of worker `worker_id`:
// $XDG_RUNTIME_DIR/muonps/worker-ID.sock when `xdg_runtime_dir` is not
// empty, else /tmp/muonps-UID/worker-ID.sock. Clients compute the same.
std::string DefaultSocketPath(const std::string& worker_id,
                              const std::string& xdg_runtime_dir, uid_t uid);

// Makes `dir` a private directory of `owner`: creates it (mode 0700, or
// 0710 with group `group` so that its members can reach a socket inside)
// when missing, then checks what is there. FAILED_PRECONDITION naming the
// path when it is a symlink or not a directory, is owned by another user,
// or is open to others (any group/world permission bit beyond the 0710
// granted to `group`); INTERNAL naming the call for system errors. An
// existing directory is checked, never changed.
absl::Status PreparePrivateDirectory(const std::string& dir, uid_t owner,
                                     std::optional<gid_t> group);

struct LocalListenerOptions {
  // The socket's path. Its parent directory must exist.
  std::string path;
  PeerPolicy policy;
};

class LocalListener {
 public:
  // Called with each accepted connection's fd (non-blocking, close-on-exec);
  // the callee owns it.
  using AcceptFn = std::function<void(int fd)>;

  // Creates the socket at options.path (mode 0600 under umask 077; 0660
  // with the allowed group as its group), binds and listens. A socket file
  // left there by a dead process (nothing accepts on it) is replaced.
  // Fails with ALREADY_EXISTS naming the path when a live process listens
  // there, FAILED_PRECONDITION naming it when something other than a socket
  // is there, INVALID_ARGUMENT when the path is too long for a Unix socket,
  // INTERNAL naming the call for other system errors.
  static absl::StatusOr<std::unique_ptr<LocalListener>> Bind(
      LocalListenerOptions options);

  LocalListener(const LocalListener&) = delete;
  LocalListener& operator=(const LocalListener&) = delete;

  // Stops accepting, closes the socket and removes its file.
  ~LocalListener();

  // Starts accepting on the listener's thread: each connection whose peer
  // passes CheckPeer goes to `accept`; others are closed and logged.
  void Start(AcceptFn accept);

  const std::string& path() const { return options_.path; }

 private:
  LocalListener(LocalListenerOptions options, int fd, int wake_read,
                int wake_write);
  void AcceptLoop(AcceptFn accept);

  LocalListenerOptions options_;
  int fd_;
  int wake_read_;  // readable once the destructor asks the thread to stop
  int wake_write_;
  std::thread thread_;
};

// The worker's socket as main() opens it: `socket_flag` (--socket) or, when
// empty, DefaultSocketPath(worker_id, $XDG_RUNTIME_DIR, euid); the parent
// directory is made private (PreparePrivateDirectory) when it is the
// default one or when this call creates it; a --socket in an existing
// directory is used as it is (the socket itself is still 0600). Then
// LocalListener::Bind for the worker's euid and `allowed_group`. Errors
// as those calls' (each names the path).
absl::StatusOr<std::unique_ptr<LocalListener>> OpenWorkerSocket(
    const std::string& socket_flag, const std::string& worker_id,
    std::optional<gid_t> allowed_group);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_LOCAL_LISTENER_H_
