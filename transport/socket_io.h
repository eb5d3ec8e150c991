// POSIX TCP socket plumbing for the TCP transport: an owning descriptor,
// "host:port" parsing, listening, connecting, and whole-buffer reads and
// writes bounded by a deadline. Every socket made here is non-blocking (waits
// go through poll()), close-on-exec, TCP_NODELAY, and asks for large kernel
// buffers. Errors are absl::Status values carrying errno's text; a closed or
// reset connection is UNAVAILABLE and a passed deadline DEADLINE_EXCEEDED.
// Callers add which peer a failure concerns. Free functions are thread-safe;
// one Socket is used by one thread at a time.
#ifndef MUONPS_TRANSPORT_SOCKET_IO_H_
#define MUONPS_TRANSPORT_SOCKET_IO_H_

#include <chrono>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace muonps {
namespace transport {

// Deadlines run on the monotonic clock so wall-clock jumps cannot fire or
// postpone a timeout.
using Deadline = std::chrono::steady_clock::time_point;

// Now plus `timeout` (negative counts as zero).
Deadline DeadlineAfter(absl::Duration timeout);

// Milliseconds from now until `deadline`, rounded up, at least 0: a poll()
// timeout that does not wake just before the deadline.
int MillisecondsUntil(Deadline deadline);

// Owns one file descriptor and closes it on destruction. Move-only.
class Socket {
 public:
  Socket() = default;
  // Takes ownership of `fd` (>= 0).
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor now; a peer then sees end-of-stream (or a reset
  // when unread data remained). Idempotent.
  void Close();

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  int port = 0;
};

// Parses "host:port" or "[ipv6]:port"; INVALID_ARGUMENT naming `address`
// when malformed or the port is outside [1, 65535].
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// "host:port", bracketing IPv6 literals.
std::string FormatHostPort(const HostPort& address);

// A listening socket on `host`:`port` (0 picks a free port), with
// SO_REUSEADDR and the transport's buffer sizes, which accepted connections
// inherit. UNAVAILABLE if the address cannot be resolved or bound.
absl::StatusOr<Socket> ListenOn(const std::string& host, int port);

// The local port `socket` is bound to.
absl::StatusOr<int> LocalPort(const Socket& socket);

// One connection accepted from `listener`; DEADLINE_EXCEEDED if none arrives
// before `deadline`.
absl::StatusOr<Socket> AcceptBefore(const Socket& listener, Deadline deadline);

// "host:port" of the remote end of `socket`, for logs; "unknown peer" if
// the kernel cannot say (it has already closed).
std::string RemoteAddress(const Socket& socket);

// One attempt to connect to `address`; UNAVAILABLE if refused or
// unreachable, DEADLINE_EXCEEDED if not established before `deadline`.
absl::StatusOr<Socket> ConnectOnce(const HostPort& address, Deadline deadline);

// Writes all `bytes` of `data`; UNAVAILABLE if the peer closed or reset the
// connection, DEADLINE_EXCEEDED if not done before `deadline`.
absl::Status WriteAllBefore(const Socket& socket, const void* data,
                            size_t bytes, Deadline deadline);

// Reads exactly `bytes` into `data`; UNAVAILABLE on end-of-stream or reset,
// DEADLINE_EXCEEDED if not done before `deadline`.
absl::Status ReadAllBefore(const Socket& socket, void* data, size_t bytes,
                           Deadline deadline);

// UNAVAILABLE "<what>: <strerror(err)>": the status of a connection that
// failed mid-use (reset, broken pipe, ...), whatever the errno.
absl::Status ConnectionError(absl::string_view what, int err);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_SOCKET_IO_H_
