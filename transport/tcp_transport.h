// The CPU transport: Transport over one TCP connection per pair of ranks.
//
// Setup. Each worker binds a TcpListener on its data port once at startup
// and announces "host:port". For each session (a plan version) every rank
// calls TcpTransport::Connect with the same address list and session; the
// lower rank of each pair accepts and the higher rank connects, and a
// handshake {wire version, session, from rank, to rank, world size, a fresh
// nonce from each side} confirms every connection, so a stale connection
// from an older session or one meant for another rank is refused rather
// than mistaken for a new one (tcp_mesh.h). Both ends of every connection
// prove they hold the job's data-plane secret (TcpOptions) with an
// HMAC-SHA256 over that handshake (membership_proof.h): a process that
// knows the session, ranks and addresses but not the secret can neither
// take a rank nor pass for one, and a recorded handshake cannot be
// replayed. Slow or idle connections to the listener do not delay the real
// peers' handshakes (mesh_acceptor.h).
//
// Framing. Every message carries a 24-byte header {kind, sequence number,
// bytes} (wire_format.h); a call's element count and DType only fix its
// size in bytes (count * DTypeSize(dtype)), which the header carries. Sizes are
// not negotiated: the receiver knows what it expects, and reads and checks each
// header before it reads any payload: a header that differs (the ranks issued
// different calls, sizes, or orders; a peer sending more than expected) fails
// the call with INTERNAL naming the peer, and bytes that are not a header with
// DATA_LOSS, leaving the receiving buffer untouched.
//
// Groups. Calls between GroupStart() and GroupEnd() are checked and queued
// (returning OK or INVALID_ARGUMENT) and all run at the outermost GroupEnd()
// (groups nest, as with ncclGroupStart). There, every message of the group,
// to and from every peer, progresses at once through one poll() loop on the
// calling thread, so ranks that all send before they receive cannot block
// one another on full socket buffers. Messages between two ranks keep call
// order, so both must queue their shared calls in the same order. Every
// buffer of a queued call must stay valid and unchanged until GroupEnd()
// returns, and no call of a group may read what another call of the same
// group writes; ReduceSum and ReduceSumIn results are summed after all
// transfers of the group have arrived. Outside a group each call is a group
// of one and has completed when it returns (a sent message may still sit in
// kernel buffers).
//
// Collectives. ReduceSum is a star: the root receives every other rank's
// buffer (concurrently, into a scratch buffer per peer, kept between calls
// for reuse) and sums in float in the caller's order (rank order 0, 1, 2,
// ... by default) whoever the root is, so results are bit-identical from
// run to run. ReduceSumIn is the same star among the members of a split's
// group (in ascending rank order by default), BroadcastIn the root sending
// to each member. Broadcast: the root sends to every other rank. With a
// single rank (or member), ReduceSum (ReduceSumIn) copies and Broadcast
// does nothing.
//
// Errors. A call waiting on a peer past io_timeout with no byte moving, or
// not finished call_timeout after it began (a peer trickling bytes cannot
// hold it longer), fails with DEADLINE_EXCEEDED, a peer that closed or
// reset its connection with
// UNAVAILABLE, each naming the peer rank. After any failed call (including
// INVALID_ARGUMENT: the peers expected that call's messages) the transport
// is broken: later calls fail at once with FAILED_PRECONDITION quoting the
// first error, and the transport must be rebuilt with Connect.
//
// Thread safety: a TcpTransport is used by one thread at a time.
#ifndef MUONPS_TRANSPORT_TCP_TRANSPORT_H_
#define MUONPS_TRANSPORT_TCP_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/group_nesting.h"
#include "transport/message_transfer.h"
#include "transport/socket_io.h"
#include "transport/tcp_mesh.h"
#include "transport/transport.h"

namespace muonps {
namespace transport {

struct TcpOptions {
  // The job's data-plane secret (bytes; at least kMinDataPlaneSecretBytes =
  // 16), which the coordinator hands only to workers that joined the job.
  // Required: Connect refuses an empty or shorter one. Every rank of a
  // session must hold the same one. Never logged.
  std::string data_plane_secret;
  // How long Connect keeps trying to open and confirm every connection.
  absl::Duration connect_timeout = absl::Seconds(10);
  // How long a call waits while no byte moves to or from a peer it is
  // exchanging with before failing with DEADLINE_EXCEEDED. Also the time
  // each accepted connection has to complete its handshake.
  absl::Duration io_timeout = absl::Seconds(10);
  // The most one call (or one group, from its GroupEnd) may take in all,
  // however its bytes trickle, before failing with DEADLINE_EXCEEDED.
  absl::Duration call_timeout = absl::Seconds(60);
  // Which pairs of ranks connect (tcp_mesh.h). On a tree mesh only a
  // parent and its children exchange messages: a Send, Recv or AwaitFrom
  // between two other ranks is refused (INVALID_ARGUMENT), and so are
  // ReduceSum, ReduceSumIn and Broadcast (collectives pass along the tree
  // in worker::ControlChannel, from neighbor to neighbor).
  MeshShape shape = MeshShape::Full();
};

// A worker's data port: a TCP socket listening on host:port. Bound once at
// startup and lent to each TcpTransport::Connect in turn (one at a time).
// Thread-compatible; not copyable.
class TcpListener {
 public:
  // Listens on `host` (a name or address literal; "0.0.0.0" for every IPv4
  // interface) and `port` (0 picks a free one). INVALID_ARGUMENT for a port
  // outside [0, 65535]; UNAVAILABLE if the address cannot be resolved or
  // bound (for example, the port is taken).
  static absl::StatusOr<std::unique_ptr<TcpListener>> Bind(
      const std::string& host, int port);

  TcpListener(const TcpListener&) = delete;
  TcpListener& operator=(const TcpListener&) = delete;

  // The port actually bound.
  int port() const { return port_; }
  // "host:port" as given to Bind with the bound port; announce a reachable
  // host name instead when bound to a wildcard address.
  std::string address() const;
  // The listening socket, for TcpTransport::Connect.
  const Socket& socket() const { return socket_; }

 private:
  TcpListener(std::string host, int port, Socket socket)
      : host_(std::move(host)), port_(port), socket_(std::move(socket)) {}

  std::string host_;
  int port_;
  Socket socket_;
};

class TcpTransport final : public Transport {
 public:
  // Connects `rank` to every other rank of `peer_addresses` ("host:port",
  // index = rank, this rank's own entry included; size() is its length) for
  // `session` (for example the plan version; every rank must pass the same).
  // `listener` is this rank's listener, not owned, used only during the call.
  // Returns the connected transport. INVALID_ARGUMENT for a null listener, a
  // rank out of range, a malformed address, a non-positive timeout or a
  // missing or short options.data_plane_secret (the message names the
  // field, never the secret); when
  // options.connect_timeout passes first, FAILED_PRECONDITION if a peer
  // disagreed in the handshake (the message names the peer and the values,
  // for example the two sessions) or failed the job's membership proof, and
  // DEADLINE_EXCEEDED if one never answered.
  static absl::StatusOr<std::unique_ptr<TcpTransport>> Connect(
      TcpListener* listener, int rank,
      const std::vector<std::string>& peer_addresses, uint64_t session,
      const TcpOptions& options);

  // Closes every connection; peers waiting on this rank see UNAVAILABLE.
  ~TcpTransport() override = default;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(sockets_.size()); }
  MemoryKind memory() const override { return MemoryKind::kHost; }

  // FAILED_PRECONDITION if broken.
  absl::Status GroupStart() override;
  // Runs the queued calls (see the file comment); FAILED_PRECONDITION
  // without a matching GroupStart.
  absl::Status GroupEnd() override;

  // INVALID_ARGUMENT (and broken) when count * DTypeSize(dtype) overflows.
  absl::Status Send(const void* data, size_t count, DType dtype, int peer,
                    Stream stream) override;
  absl::Status Recv(void* data, size_t count, DType dtype, int peer,
                    Stream stream) override;
  // `recv` may be `send` itself but must not partly overlap it.
  absl::Status ReduceSum(const float* send, float* recv, size_t count, int root,
                         absl::Span<const int> order, Stream stream) override;
  // ReduceSum's star among the members of this rank's group of `split`.
  absl::Status ReduceSumIn(Split split, const float* send, float* recv,
                           size_t count, int root, absl::Span<const int> order,
                           Stream stream) override;
  absl::Status Broadcast(void* data, size_t count, DType dtype, int root,
                         Stream stream) override;
  // Calls have finished when they return: OK unless broken.
  absl::Status Synchronize(Stream stream, absl::Duration timeout) override;
  // `count` and `dtype` are not needed: the socket becoming readable says a
  // message has begun to arrive.
  absl::Status AwaitFrom(int peer, size_t count, DType dtype,
                         absl::Duration timeout) override;
  // Shuts every connection down: a call blocked on a peer (in this or
  // another thread) fails at once, and so does every later call.
  void Abort(const absl::Status& reason) override;
  RankTree tree() const override { return options_.shape.tree(size()); }

 private:
  // The root's share of one ReduceSum, summed once its transfers arrived.
  struct PendingSum {
    std::vector<const float*> parts;  // In summation order.
    float* recv = nullptr;
    size_t count = 0;
  };

  TcpTransport(int rank, uint64_t session, const TcpOptions& options,
               std::vector<Connection> sockets);

  // FAILED_PRECONDITION quoting the first error once broken.
  absl::Status Usable() const;
  // INVALID_ARGUMENT (breaking the transport) unless kHostStream.
  absl::Status HostStreamOnly(Stream stream);
  // Marks the transport broken by `status` (annotated with rank and
  // session) and returns it.
  absl::Status Fail(const absl::Status& status);
  // INVALID_ARGUMENT naming `role` unless `peer` is a rank (this one only
  // with `allow_self`). Without `allow_self` it is a peer this rank
  // exchanges messages with, so it must also be connected to this rank
  // (every pair but on a tree mesh, where only parents and children are).
  absl::Status CheckRank(int peer, const char* role, bool allow_self) const;
  // INVALID_ARGUMENT naming `call` on a tree mesh: a collective reaches
  // every rank, and a tree connects only neighbors.
  absl::Status CheckCollective(absl::string_view call) const;
  // The star of ReduceSum and ReduceSumIn among `members` (ascending, this
  // rank among them), `call` naming it in messages: the root queues a
  // receive of every other member's part into scratch and sums the parts in
  // the checked order once they have arrived; the others send theirs.
  absl::Status Sum(absl::string_view call, const std::vector<int>& members,
                   const float* send, float* recv, size_t count, int root,
                   absl::Span<const int> order, Stream stream);
  // Runs the queue unless inside a group.
  absl::Status RunUnlessGrouped();
  void QueueSend(int peer, MessageKind kind, const void* data, size_t bytes);
  void QueueRecv(int peer, MessageKind kind, void* data, size_t bytes);
  float* Scratch(size_t count);

  const int rank_;
  const uint64_t session_;
  const TcpOptions options_;
  // Index = rank; this rank's is empty.
  std::vector<Connection> sockets_;
  std::vector<uint64_t> next_send_sequence_;
  std::vector<uint64_t> next_recv_sequence_;
  GroupNesting group_;
  std::vector<OutgoingMessage> outgoing_;
  std::vector<IncomingMessage> incoming_;
  std::vector<PendingSum> sums_;
  std::vector<std::vector<float>> scratch_;
  size_t scratch_in_use_ = 0;
  absl::Status broken_;
  mutable absl::Mutex abort_mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(abort_mu_);
};

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_TCP_TRANSPORT_H_
