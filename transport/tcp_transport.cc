#include "transport/tcp_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "transport/membership_proof.h"
#include "transport/tcp_mesh.h"

namespace muonps {
namespace transport {
namespace {

// out = ((parts[0] + parts[1]) + parts[2]) + ... elementwise, in float. One
// cache-sized block at a time through a local accumulator, so `out` may be
// one of the parts (the root's own send buffer) without changing the result.
void SumInOrder(const std::vector<const float*>& parts, float* out,
                size_t count) {
  if (parts.size() == 1 && parts[0] == out) return;  // in place, alone
  constexpr size_t kBlock = 1024;
  float block[kBlock];
  for (size_t begin = 0; begin < count; begin += kBlock) {
    const size_t n = std::min(kBlock, count - begin);
    std::copy_n(parts[0] + begin, n, block);
    for (size_t i = 1; i < parts.size(); ++i) {
      const float* part = parts[i] + begin;
      for (size_t k = 0; k < n; ++k) block[k] += part[k];
    }
    std::copy_n(block, n, out + begin);
  }
}

// The transport keeps its options for the calls, which need no secret.
TcpOptions WithoutSecret(TcpOptions options) {
  options.data_plane_secret.clear();
  return options;
}

// count * DTypeSize(dtype), or INVALID_ARGUMENT naming `call` when that
// does not fit a size_t.
absl::StatusOr<size_t> BytesOf(const char* call, size_t count, DType dtype) {
  const size_t element = DTypeSize(dtype);
  if (count > std::numeric_limits<size_t>::max() / element) {
    return absl::InvalidArgumentError(absl::StrCat(
        call, ": count ", count, " of ", DTypeName(dtype), " is too large"));
  }
  return count * element;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Bind(
    const std::string& host, int port) {
  MUONPS_ASSIGN_OR_RETURN(Socket socket, ListenOn(host, port));
  MUONPS_ASSIGN_OR_RETURN(const int bound, LocalPort(socket));
  return absl::WrapUnique(new TcpListener(host, bound, std::move(socket)));
}

std::string TcpListener::address() const {
  return FormatHostPort({host_, port_});
}

absl::StatusOr<std::unique_ptr<TcpTransport>> TcpTransport::Connect(
    TcpListener* listener, int rank,
    const std::vector<std::string>& peer_addresses, uint64_t session,
    const TcpOptions& options) {
  if (listener == nullptr) {
    return absl::InvalidArgumentError("listener: must not be null");
  }
  const int world = static_cast<int>(peer_addresses.size());
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": must be in [0, ", world,
                     ") (the number of peer_addresses)"));
  }
  if (options.connect_timeout <= absl::ZeroDuration() ||
      options.io_timeout <= absl::ZeroDuration() ||
      options.call_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "options: connect_timeout, io_timeout and call_timeout must be "
        "positive");
  }
  if (options.shape.tree_fanout < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.shape: a tree's fanout must be positive, not ",
                     options.shape.tree_fanout));
  }
  MUONPS_RETURN_IF_ERROR(CheckDataPlaneSecret(options.data_plane_secret,
                                              "TcpOptions.data_plane_secret"));
  std::vector<HostPort> addresses;
  for (int peer = 0; peer < world; ++peer) {
    absl::StatusOr<HostPort> address = ParseHostPort(peer_addresses[peer]);
    if (!address.ok()) {
      return Annotate(address.status(),
                      absl::StrCat("peer_addresses[", peer, "]"));
    }
    addresses.push_back(*std::move(address));
  }
  MUONPS_ASSIGN_OR_RETURN(
      std::vector<Connection> sockets,
      ConnectMesh(listener->socket(), rank, addresses, session,
                  options.data_plane_secret, options.connect_timeout,
                  options.io_timeout, options.shape));
  return absl::WrapUnique(
      new TcpTransport(rank, session, options, std::move(sockets)));
}

TcpTransport::TcpTransport(int rank, uint64_t session,
                           const TcpOptions& options,
                           std::vector<Connection> sockets)
    : rank_(rank),
      session_(session),
      options_(WithoutSecret(options)),
      sockets_(std::move(sockets)),
      next_send_sequence_(sockets_.size(), 0),
      next_recv_sequence_(sockets_.size(), 0) {}

absl::Status TcpTransport::HostStreamOnly(Stream stream) {
  if (stream == kHostStream) return absl::OkStatus();
  return Fail(absl::InvalidArgumentError(
      "the TCP transport moves host memory: stream must be kHostStream"));
}

absl::Status TcpTransport::Synchronize(Stream stream, absl::Duration) {
  MUONPS_RETURN_IF_ERROR(Usable());
  return HostStreamOnly(stream);
}

absl::Status TcpTransport::AwaitFrom(int peer, size_t /*count*/,
                                     DType /*dtype*/, absl::Duration timeout) {
  MUONPS_RETURN_IF_ERROR(Usable());
  MUONPS_RETURN_IF_ERROR(CheckRank(peer, "peer", /*allow_self=*/false));
  if (group_.grouped()) {
    return absl::FailedPreconditionError("AwaitFrom inside a group");
  }
  pollfd p{};
  p.fd = sockets_[peer].socket.fd();
  p.events = POLLIN;
  const absl::Time deadline = absl::Now() + timeout;
  int ready = 0;
  do {
    const int64_t ms = std::clamp<int64_t>(
        absl::ToInt64Milliseconds(deadline - absl::Now()), 0, 1 << 30);
    ready = poll(&p, 1, static_cast<int>(ms));
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) {
    return Fail(absl::UnavailableError(
        absl::StrCat("poll on rank ", peer, ": ", std::strerror(errno))));
  }
  // Abort shuts the sockets down, which wakes this poll: say so.
  MUONPS_RETURN_IF_ERROR(Usable());
  if (ready == 0) {
    return absl::DeadlineExceededError(
        absl::StrCat("no message from rank ", peer, " within ",
                     absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

void TcpTransport::Abort(const absl::Status& reason) {
  {
    absl::MutexLock lock(&abort_mu_);
    if (aborted_.ok())
      aborted_ = reason.ok() ? absl::AbortedError("aborted") : reason;
  }
  // Wakes a call blocked in poll() on any of them; the descriptors stay
  // open (owned by the sockets) until the transport is destroyed.
  for (const Connection& connection : sockets_) {
    if (connection.valid()) shutdown(connection.socket.fd(), SHUT_RDWR);
  }
}

absl::Status TcpTransport::Usable() const {
  {
    absl::MutexLock lock(&abort_mu_);
    if (!aborted_.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "transport was aborted and must be rebuilt: ", aborted_.ToString()));
    }
  }
  if (broken_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("transport is broken by an earlier error and must be "
                   "rebuilt; the error was: ",
                   broken_.ToString()));
}

absl::Status TcpTransport::Fail(const absl::Status& status) {
  broken_ = Annotate(status, absl::StrCat("TCP transport rank ", rank_,
                                          " (session ", session_, ")"));
  outgoing_.clear();
  incoming_.clear();
  sums_.clear();
  scratch_in_use_ = 0;
  group_.Reset();
  return broken_;
}

absl::Status TcpTransport::CheckRank(int peer, const char* role,
                                     bool allow_self) const {
  if (peer < 0 || peer >= size() || (!allow_self && peer == rank_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        role, " ", peer, ": must be a rank in [0, ", size(), ")",
        allow_self ? "" : absl::StrCat(" other than this rank (", rank_, ")")));
  }
  // A peer this rank exchanges messages with must be connected to it.
  if (!allow_self && !options_.shape.Connects(rank_, peer, size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(role, " ", peer, ": rank ", rank_, " of a tree of fanout ",
                     options_.shape.tree_fanout,
                     " connects to its parent and children alone"));
  }
  return absl::OkStatus();
}

absl::Status TcpTransport::CheckCollective(absl::string_view call) const {
  if (options_.shape.full()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(call,
                   ": a tree mesh connects neighbors alone; pass it "
                   "from neighbor to neighbor"));
}

void TcpTransport::QueueSend(int peer, MessageKind kind, const void* data,
                             size_t bytes) {
  OutgoingMessage message;
  message.peer = peer;
  message.header = {kind, next_send_sequence_[peer]++, bytes};
  message.data = data;
  outgoing_.push_back(message);
}

void TcpTransport::QueueRecv(int peer, MessageKind kind, void* data,
                             size_t bytes) {
  IncomingMessage message;
  message.peer = peer;
  message.expected = {kind, next_recv_sequence_[peer]++, bytes};
  message.data = data;
  incoming_.push_back(message);
}

float* TcpTransport::Scratch(size_t count) {
  // Growing the outer vector moves the inner ones, which keeps their data
  // where it is: pointers handed out earlier in this batch stay valid.
  if (scratch_in_use_ == scratch_.size()) scratch_.emplace_back();
  std::vector<float>& buffer = scratch_[scratch_in_use_++];
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

absl::Status TcpTransport::RunUnlessGrouped() {
  if (group_.grouped()) return absl::OkStatus();
  const absl::Status moved =
      TransferMessages(sockets_, outgoing_, incoming_, options_.io_timeout,
                       options_.call_timeout);
  if (!moved.ok()) return Fail(moved);
  for (const PendingSum& sum : sums_) {
    SumInOrder(sum.parts, sum.recv, sum.count);
  }
  outgoing_.clear();
  incoming_.clear();
  sums_.clear();
  scratch_in_use_ = 0;
  return absl::OkStatus();
}

absl::Status TcpTransport::GroupStart() {
  MUONPS_RETURN_IF_ERROR(Usable());
  group_.Start();
  return absl::OkStatus();
}

absl::Status TcpTransport::GroupEnd() {
  MUONPS_RETURN_IF_ERROR(Usable());
  const absl::StatusOr<bool> outermost = group_.End();
  if (!outermost.ok()) return Fail(outermost.status());
  if (!*outermost) return absl::OkStatus();
  return RunUnlessGrouped();
}

absl::Status TcpTransport::Send(const void* data, size_t count, DType dtype,
                                int peer, Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  MUONPS_RETURN_IF_ERROR(HostStreamOnly(stream));
  const absl::StatusOr<size_t> bytes = BytesOf("Send", count, dtype);
  absl::Status valid = bytes.status();
  if (valid.ok()) {
    valid = CheckRank(peer, "Send: peer", /*allow_self=*/false);
  }
  if (valid.ok() && data == nullptr && *bytes > 0) {
    valid = absl::InvalidArgumentError("Send: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  QueueSend(peer, MessageKind::kPointToPoint, data, *bytes);
  return RunUnlessGrouped();
}

absl::Status TcpTransport::Recv(void* data, size_t count, DType dtype, int peer,
                                Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  MUONPS_RETURN_IF_ERROR(HostStreamOnly(stream));
  const absl::StatusOr<size_t> bytes = BytesOf("Recv", count, dtype);
  absl::Status valid = bytes.status();
  if (valid.ok()) {
    valid = CheckRank(peer, "Recv: peer", /*allow_self=*/false);
  }
  if (valid.ok() && data == nullptr && *bytes > 0) {
    valid = absl::InvalidArgumentError("Recv: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  QueueRecv(peer, MessageKind::kPointToPoint, data, *bytes);
  return RunUnlessGrouped();
}

absl::Status TcpTransport::ReduceSum(const float* send, float* recv,
                                     size_t count, int root,
                                     absl::Span<const int> order,
                                     Stream stream) {
  return Sum("ReduceSum", EveryRank(), send, recv, count, root, order, stream);
}

absl::Status TcpTransport::ReduceSumIn(Split split, const float* send,
                                       float* recv, size_t count, int root,
                                       absl::Span<const int> order,
                                       Stream stream) {
  return Sum(CallIn("ReduceSumIn", split), MembersOf(split), send, recv, count,
             root, order, stream);
}

absl::Status TcpTransport::Sum(absl::string_view call,
                               const std::vector<int>& members,
                               const float* send, float* recv, size_t count,
                               int root, absl::Span<const int> order,
                               Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  MUONPS_RETURN_IF_ERROR(HostStreamOnly(stream));
  const absl::Status collective = CheckCollective(call);
  if (!collective.ok()) return Fail(collective);
  const absl::StatusOr<std::vector<int>> sum_order =
      CheckSum(call, members, send, recv, count, root, order);
  if (!sum_order.ok()) return Fail(sum_order.status());
  const size_t bytes = count * sizeof(float);
  if (root != rank_) {
    QueueSend(root, MessageKind::kReduce, send, bytes);
    return RunUnlessGrouped();
  }
  // Every other member's part lands in scratch; the parts are summed in
  // `sum_order` once the group's transfers have arrived.
  PendingSum sum;
  sum.recv = recv;
  sum.count = count;
  for (const int member : *sum_order) {
    if (member == rank_) {
      sum.parts.push_back(send);
      continue;
    }
    float* part = Scratch(count);
    QueueRecv(member, MessageKind::kReduce, part, bytes);
    sum.parts.push_back(part);
  }
  sums_.push_back(std::move(sum));
  return RunUnlessGrouped();
}

absl::Status TcpTransport::Broadcast(void* data, size_t count, DType dtype,
                                     int root, Stream stream) {
  MUONPS_RETURN_IF_ERROR(Usable());
  MUONPS_RETURN_IF_ERROR(HostStreamOnly(stream));
  const absl::StatusOr<size_t> bytes = BytesOf("Broadcast", count, dtype);
  absl::Status valid = bytes.status();
  if (valid.ok()) valid = CheckCollective("Broadcast");
  if (valid.ok()) {
    valid = CheckRank(root, "Broadcast: root", /*allow_self=*/true);
  }
  if (valid.ok() && data == nullptr && *bytes > 0) {
    valid = absl::InvalidArgumentError("Broadcast: data is null");
  }
  if (!valid.ok()) return Fail(valid);
  if (root != rank_) {
    QueueRecv(root, MessageKind::kBroadcast, data, *bytes);
  } else {
    for (int peer = 0; peer < size(); ++peer) {
      if (peer != rank_) {
        QueueSend(peer, MessageKind::kBroadcast, data, *bytes);
      }
    }
  }
  return RunUnlessGrouped();
}

}  // namespace transport
}  // namespace muonps
