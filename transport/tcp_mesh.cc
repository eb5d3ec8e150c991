#include "transport/tcp_mesh.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "transport/membership_proof.h"
#include "transport/mesh_acceptor.h"
#include "transport/wire_format.h"

namespace muonps {
namespace transport {
namespace {

constexpr std::chrono::milliseconds kFirstRetryDelay(10);
constexpr std::chrono::milliseconds kLongestRetryDelay(200);

absl::StatusOr<Handshake> ExchangeHello(const Socket& socket,
                                        const Handshake& hello,
                                        Deadline deadline) {
  unsigned char bytes[kHandshakeBytes];
  EncodeHandshake(hello, bytes);
  MUONPS_RETURN_IF_ERROR(
      Annotate(WriteAllBefore(socket, bytes, sizeof(bytes), deadline),
               "sending the handshake"));
  MUONPS_RETURN_IF_ERROR(
      Annotate(ReadAllBefore(socket, bytes, sizeof(bytes), deadline),
               "awaiting the handshake reply"));
  Handshake reply;
  if (!DecodeHandshake(bytes, &reply)) {
    return absl::UnavailableError("the reply is not a muonps handshake");
  }
  return reply;
}

// What differs between this rank's `hello` and the peer's `reply`.
std::string DescribeRefusal(const Handshake& hello, const Handshake& reply) {
  const std::string why = absl::StrCat("refused the handshake (",
                                       HandshakeVerdictName(reply.verdict));
  switch (reply.verdict) {
    case HandshakeVerdict::kWrongSession:
      return absl::StrCat(why, "): it is on session ", reply.session,
                          ", this rank offered session ", hello.session);
    case HandshakeVerdict::kWrongWorldSize:
      return absl::StrCat(why, "): it has ", reply.world_size,
                          " ranks, this rank has ", hello.world_size);
    case HandshakeVerdict::kWrongVersion:
      return absl::StrCat(why, "): it speaks version ", reply.version,
                          ", this rank version ", hello.version);
    default:
      return absl::StrCat(why, "): it is rank ", reply.from_rank,
                          ", this rank is rank ", hello.from_rank,
                          " and expected rank ", hello.to_rank, " there");
  }
}

bool IsAcceptanceOf(const Handshake& reply, const Handshake& hello) {
  return reply.verdict == HandshakeVerdict::kAccepted &&
         reply.version == kWireVersion && reply.session == hello.session &&
         reply.from_rank == hello.to_rank && reply.to_rank == hello.from_rank &&
         reply.world_size == hello.world_size;
}

// Whether a refusal is that of a peer on another plan's session or size:
// a plan still reaching every rank, which a retry outlasts.
bool TransientRefusal(HandshakeVerdict verdict) {
  return verdict == HandshakeVerdict::kWrongSession ||
         verdict == HandshakeVerdict::kWrongWorldSize;
}

// One attempt: hello, acceptance (checked against the secret), confirmation.
// The connected socket; UNAVAILABLE or DEADLINE_EXCEEDED for a connection
// that failed, FAILED_PRECONDITION for a refusal or a failed proof (with
// *transient set for a TransientRefusal).
absl::StatusOr<Connection> TryConnect(int peer, const HostPort& address,
                                      const MeshParams& params,
                                      bool* transient) {
  *transient = false;
  Handshake hello;
  hello.session = params.session;
  hello.from_rank = params.rank;
  hello.to_rank = peer;
  hello.world_size = params.world;
  MUONPS_ASSIGN_OR_RETURN(hello.nonce, FreshNonce());
  MUONPS_ASSIGN_OR_RETURN(Socket socket, ConnectOnce(address, params.deadline));
  MUONPS_ASSIGN_OR_RETURN(Handshake reply,
                          ExchangeHello(socket, hello, params.deadline));
  if (!IsAcceptanceOf(reply, hello)) {
    *transient = TransientRefusal(reply.verdict);
    return absl::FailedPreconditionError(DescribeRefusal(hello, reply));
  }
  HandshakeTranscript transcript;
  transcript.session = params.session;
  transcript.connecting_rank = params.rank;
  transcript.accepting_rank = peer;
  transcript.world_size = params.world;
  transcript.connecting_nonce = hello.nonce;
  transcript.accepting_nonce = reply.nonce;
  if (!VerifyMembership(params.secret, ProvingSide::kAcceptingRank, transcript,
                        reply.proof)) {
    const std::string why = absl::StrCat(
        "its acceptance failed the job's membership proof (it, or this "
        "rank, holds another job's data-plane secret)");
    spdlog::warn("session={} rank={} peer rank {} at {}: {}", params.session,
                 params.rank, peer, RemoteAddress(socket), why);
    return absl::FailedPreconditionError(why);
  }
  Handshake confirmation = hello;
  confirmation.verdict = HandshakeVerdict::kConfirmed;
  confirmation.nonce = {};
  MUONPS_ASSIGN_OR_RETURN(
      confirmation.proof,
      ProveMembership(params.secret, ProvingSide::kConnectingRank, transcript));
  unsigned char bytes[kHandshakeBytes];
  EncodeHandshake(confirmation, bytes);
  MUONPS_RETURN_IF_ERROR(
      Annotate(WriteAllBefore(socket, bytes, sizeof(bytes), params.deadline),
               "sending the confirmation"));
  Connection connection;
  MUONPS_ASSIGN_OR_RETURN(
      connection.keys.send,
      DeriveFrameKey(params.secret, ProvingSide::kConnectingRank, transcript));
  MUONPS_ASSIGN_OR_RETURN(
      connection.keys.receive,
      DeriveFrameKey(params.secret, ProvingSide::kAcceptingRank, transcript));
  connection.socket = std::move(socket);
  return connection;
}

absl::StatusOr<Connection> ConnectToLowerRank(int peer, const HostPort& address,
                                              const MeshParams& params) {
  // A refusal says more than a later attempt that merely timed out (the
  // peer gave up at its own deadline), so the last refusal is what is told.
  std::string last_failure = "no attempt finished";
  std::string last_refusal;
  bool transient = false, last_transient = false;
  std::chrono::milliseconds delay = kFirstRetryDelay;
  while (true) {
    absl::StatusOr<Connection> socket =
        TryConnect(peer, address, params, &transient);
    if (socket.ok()) return socket;
    if (absl::IsFailedPrecondition(socket.status())) {
      last_refusal = std::string(socket.status().message());
      last_transient = transient;
    } else {
      last_failure = std::string(socket.status().message());
    }
    if (std::chrono::steady_clock::now() + delay >= params.deadline) break;
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, kLongestRetryDelay);
  }
  // A peer on another plan's session is UNAVAILABLE: retry once the plan
  // reached it.
  const bool refused = !last_refusal.empty();
  return absl::Status(
      !refused         ? absl::StatusCode::kDeadlineExceeded
      : last_transient ? absl::StatusCode::kUnavailable
                       : absl::StatusCode::kFailedPrecondition,
      absl::StrCat("rank ", params.rank, " could not connect to peer rank ",
                   peer, " at ", FormatHostPort(address),
                   " within connect_timeout ",
                   absl::FormatDuration(params.connect_timeout),
                   refused ? "; last refusal: " : "; last attempt: ",
                   refused ? last_refusal : last_failure));
}

}  // namespace

absl::StatusOr<std::vector<Connection>> ConnectMesh(
    const Socket& listener, int rank, const std::vector<HostPort>& addresses,
    uint64_t session, absl::string_view secret, absl::Duration connect_timeout,
    absl::Duration handshake_timeout, MeshShape shape) {
  MeshParams params;
  params.rank = rank;
  params.world = static_cast<int>(addresses.size());
  params.session = session;
  params.secret = std::string(secret);
  params.deadline = DeadlineAfter(connect_timeout);
  params.connect_timeout = connect_timeout;
  params.handshake_timeout = handshake_timeout;
  std::vector<Connection> sockets(addresses.size());
  // Lower ranks first: each of them reaches its accepting phase only after
  // its own lower ranks accepted it, so the waits form a chain, not a cycle.
  // On a tree a rank connects to its parent and accepts its children.
  for (int peer = 0; peer < rank; ++peer) {
    if (!shape.Connects(rank, peer, params.world)) continue;
    MUONPS_ASSIGN_OR_RETURN(sockets[peer],
                            ConnectToLowerRank(peer, addresses[peer], params));
  }
  for (int peer = rank + 1; peer < params.world; ++peer) {
    if (shape.Connects(rank, peer, params.world)) {
      params.accepted.push_back(peer);
    }
  }
  MUONPS_RETURN_IF_ERROR(AcceptHigherRanks(listener, params, &sockets));
  return sockets;
}

}  // namespace transport
}  // namespace muonps
