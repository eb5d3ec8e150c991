#include "transport/socket_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace muonps {
namespace transport {
namespace {

// Requested per direction; Linux doubles it for bookkeeping and caps it at
// net.core.{w,r}mem_max. Large enough that a grouped exchange keeps a
// loopback or 10 GbE link busy while the other direction drains.
constexpr int kSocketBufferBytes = 4 << 20;

absl::Status ErrnoError(absl::StatusCode code, absl::string_view what,
                        int err) {
  return absl::Status(code, absl::ErrnoToStatus(err, what).message());
}

void AskForLargeBuffers(int fd) {
  // Best effort: a smaller buffer than asked for costs speed, not
  // correctness, so failures are ignored.
  const int bytes = kSocketBufferBytes;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

absl::Status DisableNagle(int fd) {
  const int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return ErrnoError(absl::StatusCode::kInternal, "setsockopt(TCP_NODELAY)",
                      errno);
  }
  return absl::OkStatus();
}

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

absl::StatusOr<AddrInfoList> Resolve(const std::string& host, int port,
                                     bool passive) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const std::string service = absl::StrCat(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(),
                             service.c_str(), &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve \"", host, "\": ", gai_strerror(rc)));
  }
  return AddrInfoList(found);
}

// Waits for `events` on `fd`; false if `deadline` passed first.
absl::StatusOr<bool> WaitFor(int fd, short events, Deadline deadline) {
  while (true) {
    pollfd entry = {fd, events, 0};
    const int rc = poll(&entry, 1, MillisecondsUntil(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) {
      return ErrnoError(absl::StatusCode::kInternal, "poll", errno);
    }
  }
}

}  // namespace

Deadline DeadlineAfter(absl::Duration timeout) {
  return std::chrono::steady_clock::now() +
         absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration()));
}

int MillisecondsUntil(Deadline deadline) {
  const auto left = deadline - std::chrono::steady_clock::now();
  if (left <= left.zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

void Socket::Close() {
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
}

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const auto bad = [address](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\": ", why));
  };
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return bad("expected host:port");
  absl::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != absl::string_view::npos) {
    return bad("IPv6 hosts must be bracketed, as [::1]:port");
  }
  if (host.empty()) return bad("host is empty");
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return bad("port must be an integer in [1, 65535]");
  }
  return HostPort{std::string(host), port};
}

std::string FormatHostPort(const HostPort& address) {
  if (address.host.find(':') != std::string::npos) {
    return absl::StrCat("[", address.host, "]:", address.port);
  }
  return absl::StrCat(address.host, ":", address.port);
}

absl::StatusOr<Socket> ListenOn(const std::string& host, int port) {
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("port ", port, ": must be in [0, 65535]"));
  }
  absl::StatusOr<AddrInfoList> found = Resolve(host, port, /*passive=*/true);
  if (!found.ok()) return found.status();
  absl::Status last = absl::UnavailableError("no addresses");
  for (addrinfo* ai = found->get(); ai != nullptr; ai = ai->ai_next) {
    Socket socket(::socket(ai->ai_family,
                           ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                           ai->ai_protocol));
    if (!socket.valid()) {
      last = ErrnoError(absl::StatusCode::kUnavailable, "socket", errno);
      continue;
    }
    const int one = 1;
    setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    AskForLargeBuffers(socket.fd());
    if (bind(socket.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = ErrnoError(absl::StatusCode::kUnavailable, "bind", errno);
      continue;
    }
    if (listen(socket.fd(), SOMAXCONN) != 0) {
      last = ErrnoError(absl::StatusCode::kUnavailable, "listen", errno);
      continue;
    }
    return socket;
  }
  return absl::Status(last.code(), absl::StrCat("listening on ", host, ":",
                                                port, ": ", last.message()));
}

absl::StatusOr<int> LocalPort(const Socket& socket) {
  sockaddr_storage address = {};
  socklen_t length = sizeof(address);
  if (getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&address),
                  &length) != 0) {
    return ErrnoError(absl::StatusCode::kInternal, "getsockname", errno);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
}

absl::StatusOr<Socket> AcceptBefore(const Socket& listener, Deadline deadline) {
  while (true) {
    const int fd =
        accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      Socket socket(fd);
      absl::Status nodelay = DisableNagle(fd);
      if (!nodelay.ok()) return nodelay;
      return socket;
    }
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err != EAGAIN && err != EWOULDBLOCK) {
      return ErrnoError(absl::StatusCode::kUnavailable, "accept", err);
    }
    absl::StatusOr<bool> ready = WaitFor(listener.fd(), POLLIN, deadline);
    if (!ready.ok()) return ready.status();
    if (!*ready) return absl::DeadlineExceededError("no connection arrived");
  }
}

std::string RemoteAddress(const Socket& socket) {
  sockaddr_storage address = {};
  socklen_t length = sizeof(address);
  if (getpeername(socket.fd(), reinterpret_cast<sockaddr*>(&address),
                  &length) != 0) {
    return "unknown peer";
  }
  char host[INET6_ADDRSTRLEN] = {};
  int port = 0;
  if (address.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof(host));
    port = ntohs(v6->sin6_port);
  } else if (address.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof(host));
    port = ntohs(v4->sin_port);
  } else {
    return "unknown peer";
  }
  return FormatHostPort({host, port});
}

absl::StatusOr<Socket> ConnectOnce(const HostPort& address, Deadline deadline) {
  absl::StatusOr<AddrInfoList> found =
      Resolve(address.host, address.port, /*passive=*/false);
  if (!found.ok()) return found.status();
  absl::Status last = absl::UnavailableError("no addresses");
  for (addrinfo* ai = found->get(); ai != nullptr; ai = ai->ai_next) {
    Socket socket(::socket(ai->ai_family,
                           ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                           ai->ai_protocol));
    if (!socket.valid()) {
      last = ErrnoError(absl::StatusCode::kUnavailable, "socket", errno);
      continue;
    }
    // Before connect(), so the window scale offered in the SYN fits them.
    AskForLargeBuffers(socket.fd());
    if (connect(socket.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = ErrnoError(absl::StatusCode::kUnavailable, "connect", errno);
        continue;
      }
      absl::StatusOr<bool> ready = WaitFor(socket.fd(), POLLOUT, deadline);
      if (!ready.ok()) return ready.status();
      if (!*ready) return absl::DeadlineExceededError("connect timed out");
      int err = 0;
      socklen_t length = sizeof(err);
      getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &err, &length);
      if (err != 0) {
        last = ErrnoError(absl::StatusCode::kUnavailable, "connect", err);
        continue;
      }
    }
    absl::Status nodelay = DisableNagle(socket.fd());
    if (!nodelay.ok()) return nodelay;
    return socket;
  }
  return last;
}

absl::Status WriteAllBefore(const Socket& socket, const void* data,
                            size_t bytes, Deadline deadline) {
  const char* next = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t sent = send(socket.fd(), next, bytes, MSG_NOSIGNAL);
    if (sent > 0) {
      next += sent;
      bytes -= static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return ConnectionError("send", errno);
    }
    absl::StatusOr<bool> ready = WaitFor(socket.fd(), POLLOUT, deadline);
    if (!ready.ok()) return ready.status();
    if (!*ready) return absl::DeadlineExceededError("send timed out");
  }
  return absl::OkStatus();
}

absl::Status ReadAllBefore(const Socket& socket, void* data, size_t bytes,
                           Deadline deadline) {
  char* next = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t got = recv(socket.fd(), next, bytes, 0);
    if (got > 0) {
      next += got;
      bytes -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return absl::UnavailableError("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return ConnectionError("recv", errno);
    }
    absl::StatusOr<bool> ready = WaitFor(socket.fd(), POLLIN, deadline);
    if (!ready.ok()) return ready.status();
    if (!*ready) return absl::DeadlineExceededError("recv timed out");
  }
  return absl::OkStatus();
}

absl::Status ConnectionError(absl::string_view what, int err) {
  return ErrnoError(absl::StatusCode::kUnavailable, what, err);
}

}  // namespace transport
}  // namespace muonps
