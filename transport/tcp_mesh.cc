#include "transport/tcp_mesh.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "transport/wire_format.h"

namespace muonps {
namespace transport {
namespace {

constexpr std::chrono::milliseconds kFirstRetryDelay(10);
constexpr std::chrono::milliseconds kLongestRetryDelay(200);

struct MeshParams {
  int rank = 0;
  int world = 0;
  uint64_t session = 0;
  Deadline deadline;
  absl::Duration connect_timeout;
  absl::Duration handshake_timeout;
};

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

absl::StatusOr<Socket> ConnectToLowerRank(int peer, const HostPort& address,
                                          const MeshParams& params) {
  Handshake hello;
  hello.session = params.session;
  hello.from_rank = params.rank;
  hello.to_rank = peer;
  hello.world_size = params.world;
  std::string last_failure = "no attempt finished";
  bool last_was_refusal = false;
  std::chrono::milliseconds delay = kFirstRetryDelay;
  while (true) {
    absl::StatusOr<Socket> socket = ConnectOnce(address, params.deadline);
    absl::StatusOr<Handshake> reply =
        socket.ok() ? ExchangeHello(*socket, hello, params.deadline)
                    : absl::StatusOr<Handshake>(socket.status());
    if (reply.ok() && reply->verdict == HandshakeVerdict::kAccepted &&
        reply->session == params.session && reply->from_rank == peer &&
        reply->to_rank == params.rank && reply->world_size == params.world) {
      Handshake confirmation = hello;
      confirmation.verdict = HandshakeVerdict::kConfirmed;
      unsigned char bytes[kHandshakeBytes];
      EncodeHandshake(confirmation, bytes);
      const absl::Status confirmed =
          WriteAllBefore(*socket, bytes, sizeof(bytes), params.deadline);
      if (confirmed.ok()) return std::move(*socket);
      reply = Annotate(confirmed, "sending the confirmation");
    }
    last_was_refusal = reply.ok();
    last_failure = reply.ok() ? DescribeRefusal(hello, *reply)
                              : std::string(reply.status().message());
    if (std::chrono::steady_clock::now() + delay >= params.deadline) break;
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, kLongestRetryDelay);
  }
  return absl::Status(
      last_was_refusal ? absl::StatusCode::kFailedPrecondition
                       : absl::StatusCode::kDeadlineExceeded,
      absl::StrCat("rank ", params.rank, " could not connect to peer rank ",
                   peer, " at ", FormatHostPort(address),
                   " within connect_timeout ",
                   absl::FormatDuration(params.connect_timeout),
                   "; last attempt: ", last_failure));
}

HandshakeVerdict Judge(const Handshake& hello, const MeshParams& params) {
  // Session first: a stale connection from an older session most likely
  // also disagrees on the world size, and the session is the real cause.
  if (hello.version != kWireVersion) return HandshakeVerdict::kWrongVersion;
  if (hello.session != params.session) return HandshakeVerdict::kWrongSession;
  if (hello.world_size != params.world) {
    return HandshakeVerdict::kWrongWorldSize;
  }
  if (hello.to_rank != params.rank || hello.from_rank <= params.rank ||
      hello.from_rank >= params.world) {
    return HandshakeVerdict::kWrongRank;
  }
  return HandshakeVerdict::kAccepted;
}

std::string DescribeRefusedHello(const Handshake& hello,
                                 HandshakeVerdict verdict,
                                 const MeshParams& params) {
  return absl::StrCat("refused a connection claiming to be peer rank ",
                      hello.from_rank, " (", HandshakeVerdictName(verdict),
                      "): it offered session ", hello.session, ", ",
                      hello.world_size, " ranks, addressed to rank ",
                      hello.to_rank, "; this rank is rank ", params.rank,
                      " of ", params.world, " on session ", params.session);
}

absl::Status AcceptHigherRanks(const Socket& listener, const MeshParams& params,
                               std::vector<Socket>* sockets) {
  int missing = params.world - 1 - params.rank;
  std::string last_refusal;
  while (missing > 0) {
    absl::StatusOr<Socket> socket = AcceptBefore(listener, params.deadline);
    if (absl::IsDeadlineExceeded(socket.status())) break;
    if (!socket.ok()) {
      return Annotate(socket.status(),
                      absl::StrCat("rank ", params.rank, " accepting peers"));
    }
    const Deadline hello_deadline =
        std::min(params.deadline, DeadlineAfter(params.handshake_timeout));
    unsigned char bytes[kHandshakeBytes];
    Handshake hello;
    // A connection that closes or says nothing recognizable (an abandoned
    // attempt, a port scanner) is dropped; its rank, if any, retries.
    if (!ReadAllBefore(*socket, bytes, sizeof(bytes), hello_deadline).ok() ||
        !DecodeHandshake(bytes, &hello)) {
      continue;
    }
    Handshake reply;
    reply.session = params.session;
    reply.from_rank = params.rank;
    reply.to_rank = hello.from_rank;
    reply.world_size = params.world;
    reply.verdict = Judge(hello, params);
    EncodeHandshake(reply, bytes);
    const absl::Status answered =
        WriteAllBefore(*socket, bytes, sizeof(bytes), hello_deadline);
    if (reply.verdict != HandshakeVerdict::kAccepted) {
      last_refusal = DescribeRefusedHello(hello, reply.verdict, params);
      continue;
    }
    // A hello whose sender gave up while it waited in the accept queue (an
    // earlier attempt of this same session) ends here: no confirmation.
    Handshake confirmation;
    if (!answered.ok() ||
        !ReadAllBefore(*socket, bytes, sizeof(bytes), hello_deadline).ok() ||
        !DecodeHandshake(bytes, &confirmation) ||
        confirmation.verdict != HandshakeVerdict::kConfirmed ||
        confirmation.session != params.session ||
        confirmation.from_rank != hello.from_rank) {
      continue;
    }
    // A rank opens a second connection to this one only after giving up on
    // the first, so the newest confirmed one is the live one.
    Socket& slot = (*sockets)[hello.from_rank];
    if (!slot.valid()) --missing;
    slot = std::move(*socket);
  }
  if (missing == 0) return absl::OkStatus();
  std::vector<int> absent;
  for (int peer = params.rank + 1; peer < params.world; ++peer) {
    if (!(*sockets)[peer].valid()) absent.push_back(peer);
  }
  return absl::Status(
      last_refusal.empty() ? absl::StatusCode::kDeadlineExceeded
                           : absl::StatusCode::kFailedPrecondition,
      absl::StrCat("rank ", params.rank, " waited connect_timeout ",
                   absl::FormatDuration(params.connect_timeout),
                   " for peer ranks [", absl::StrJoin(absent, ", "),
                   "] to connect", last_refusal.empty() ? "" : "; ",
                   last_refusal));
}

}  // namespace

absl::StatusOr<std::vector<Socket>> ConnectMesh(
    const Socket& listener, int rank, const std::vector<HostPort>& addresses,
    uint64_t session, absl::Duration connect_timeout,
    absl::Duration handshake_timeout) {
  MeshParams params;
  params.rank = rank;
  params.world = static_cast<int>(addresses.size());
  params.session = session;
  params.deadline = DeadlineAfter(connect_timeout);
  params.connect_timeout = connect_timeout;
  params.handshake_timeout = handshake_timeout;
  std::vector<Socket> sockets(addresses.size());
  // Lower ranks first: each of them reaches its accepting phase only after
  // its own lower ranks accepted it, so the waits form a chain, not a cycle.
  for (int peer = 0; peer < rank; ++peer) {
    MUONPS_ASSIGN_OR_RETURN(sockets[peer],
                            ConnectToLowerRank(peer, addresses[peer], params));
  }
  MUONPS_RETURN_IF_ERROR(AcceptHigherRanks(listener, params, &sockets));
  return sockets;
}

}  // namespace transport
}  // namespace muonps
