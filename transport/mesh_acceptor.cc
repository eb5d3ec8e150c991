#include "transport/mesh_acceptor.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"
#include "transport/membership_proof.h"
#include "transport/wire_format.h"

namespace muonps {
namespace transport {
namespace {

enum class Stage { kReadingHello, kWritingVerdict, kReadingConfirmation };

// One accepted connection in its handshake.
struct PendingHandshake {
  Socket socket;
  std::string address;
  Deadline deadline;
  Stage stage = Stage::kReadingHello;
  unsigned char bytes[kHandshakeBytes] = {};
  size_t done = 0;  // Of `bytes`, in the current stage.
  Handshake hello;
  Nonce accepting_nonce = {};
  bool accepted = false;
};

HandshakeVerdict Judge(const Handshake& hello, const MeshParams& params) {
  // Session first: a stale connection from an older session most likely
  // also disagrees on the world size, and the session is the real cause.
  if (hello.version != kWireVersion) return HandshakeVerdict::kWrongVersion;
  if (hello.session != params.session) return HandshakeVerdict::kWrongSession;
  if (hello.world_size != params.world) {
    return HandshakeVerdict::kWrongWorldSize;
  }
  if (hello.to_rank != params.rank ||
      !std::binary_search(params.accepted.begin(), params.accepted.end(),
                          hello.from_rank)) {
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

// Moves the current stage's bytes without blocking: true once all of them
// moved, false while waiting; `closed` when the connection ended or failed.
bool Pump(PendingHandshake& pending, bool* closed) {
  const int fd = pending.socket.fd();
  while (pending.done < kHandshakeBytes) {
    unsigned char* next = pending.bytes + pending.done;
    const size_t left = kHandshakeBytes - pending.done;
    const ssize_t moved = pending.stage == Stage::kWritingVerdict
                              ? send(fd, next, left, MSG_NOSIGNAL)
                              : recv(fd, next, left, 0);
    if (moved > 0) {
      pending.done += static_cast<size_t>(moved);
      continue;
    }
    if (moved < 0 && errno == EINTR) continue;
    if (moved < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    *closed = true;
    return false;
  }
  return true;
}

class HelloAcceptor {
 public:
  HelloAcceptor(const Socket& listener, const MeshParams& params,
                std::vector<Connection>* connections)
      : listener_(listener), params_(params), sockets_(*connections) {
    for (const int peer : params.accepted) {
      if (!sockets_[peer].valid()) ++missing_;
    }
  }

  absl::Status Run();

 private:
  absl::Status AcceptWaiting();
  // Advances `pending` after poll() saw it ready; closes its socket when
  // it is done with (connected, refused or failed).
  absl::Status Advance(PendingHandshake& pending);
  absl::Status AnswerHello(PendingHandshake& pending);
  void CheckConfirmation(PendingHandshake& pending);
  void Drop(PendingHandshake& pending, const char* why);
  absl::Status Missing() const;

  const Socket& listener_;
  const MeshParams& params_;
  std::vector<Connection>& sockets_;
  int missing_ = 0;
  std::string last_refusal_;
  // The last refusal was of a peer on another plan's session or size: a
  // plan still reaching every rank (UNAVAILABLE, not FAILED_PRECONDITION).
  bool last_refusal_transient_ = false;
  std::vector<std::unique_ptr<PendingHandshake>> pending_;
};

absl::Status HelloAcceptor::Run() {
  std::vector<pollfd> polled;
  while (missing_ > 0) {
    const Deadline now = std::chrono::steady_clock::now();
    if (now >= params_.deadline) break;
    Deadline wake = params_.deadline;
    for (auto& pending : pending_) {
      if (!pending->socket.valid()) continue;
      if (now >= pending->deadline) {
        Drop(*pending, "no complete handshake within handshake_timeout");
      } else {
        wake = std::min(wake, pending->deadline);
      }
    }
    pending_.erase(
        std::remove_if(pending_.begin(), pending_.end(),
                       [](const auto& p) { return !p->socket.valid(); }),
        pending_.end());
    polled.clear();
    polled.push_back({listener_.fd(), POLLIN, 0});
    for (const auto& pending : pending_) {
      const short events =
          pending->stage == Stage::kWritingVerdict ? POLLOUT : POLLIN;
      polled.push_back({pending->socket.fd(), events, 0});
    }
    if (poll(polled.data(), polled.size(), MillisecondsUntil(wake)) < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat(
          "rank ", params_.rank,
          " accepting peers: ", absl::ErrnoToStatus(errno, "poll").message()));
    }
    // pending_[i] is polled[i + 1]; new connections join after the loop.
    for (size_t i = 0; i + 1 < polled.size(); ++i) {
      if (polled[i + 1].revents == 0) continue;
      absl::Status advanced = Advance(*pending_[i]);
      if (!advanced.ok()) return advanced;
    }
    if (polled[0].revents != 0) {
      absl::Status accepted = AcceptWaiting();
      if (!accepted.ok()) return accepted;
    }
  }
  return Missing();
}

absl::Status HelloAcceptor::AcceptWaiting() {
  while (true) {
    absl::StatusOr<Socket> socket =
        AcceptBefore(listener_, std::chrono::steady_clock::now());
    if (absl::IsDeadlineExceeded(socket.status())) return absl::OkStatus();
    if (!socket.ok()) {
      return absl::Status(
          socket.status().code(),
          absl::StrCat("rank ", params_.rank,
                       " accepting peers: ", socket.status().message()));
    }
    // Every peer still missing may be in its handshake at once (a star's
    // rank 0 takes every other rank together): the cap keeps room for them.
    const size_t cap =
        std::max(kMaxPendingHandshakes, static_cast<size_t>(missing_));
    if (pending_.size() >= cap) {
      Drop(*pending_.front(), "evicted: too many connections in handshake");
      pending_.erase(pending_.begin());
    }
    auto pending = std::make_unique<PendingHandshake>();
    pending->address = RemoteAddress(*socket);
    pending->socket = *std::move(socket);
    pending->deadline =
        std::min(params_.deadline, DeadlineAfter(params_.handshake_timeout));
    pending_.push_back(std::move(pending));
  }
}

absl::Status HelloAcceptor::Advance(PendingHandshake& pending) {
  while (pending.socket.valid()) {
    bool closed = false;
    if (!Pump(pending, &closed)) {
      if (closed) Drop(pending, "closed before completing the handshake");
      return absl::OkStatus();
    }
    switch (pending.stage) {
      case Stage::kReadingHello: {
        absl::Status answered = AnswerHello(pending);
        if (!answered.ok()) return answered;
        break;
      }
      case Stage::kWritingVerdict:
        if (!pending.accepted) {
          pending.socket.Close();  // Refused; the verdict told it why.
          return absl::OkStatus();
        }
        pending.stage = Stage::kReadingConfirmation;
        pending.done = 0;
        break;
      case Stage::kReadingConfirmation:
        CheckConfirmation(pending);
        return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status HelloAcceptor::AnswerHello(PendingHandshake& pending) {
  if (!DecodeHandshake(pending.bytes, &pending.hello) ||
      pending.hello.verdict != HandshakeVerdict::kHello) {
    // A port scanner or a stray client: nothing to answer.
    Drop(pending, "not a muonps hello");
    return absl::OkStatus();
  }
  const Handshake& hello = pending.hello;
  Handshake reply;
  reply.session = params_.session;
  reply.from_rank = params_.rank;
  reply.to_rank = hello.from_rank;
  reply.world_size = params_.world;
  reply.verdict = Judge(hello, params_);
  pending.accepted = reply.verdict == HandshakeVerdict::kAccepted;
  if (pending.accepted) {
    absl::StatusOr<Nonce> nonce = FreshNonce();
    if (!nonce.ok()) return nonce.status();
    pending.accepting_nonce = *nonce;
    HandshakeTranscript transcript;
    transcript.session = params_.session;
    transcript.connecting_rank = hello.from_rank;
    transcript.accepting_rank = params_.rank;
    transcript.world_size = params_.world;
    transcript.connecting_nonce = hello.nonce;
    transcript.accepting_nonce = pending.accepting_nonce;
    absl::StatusOr<MembershipProof> proof = ProveMembership(
        params_.secret, ProvingSide::kAcceptingRank, transcript);
    if (!proof.ok()) return proof.status();
    reply.nonce = pending.accepting_nonce;
    reply.proof = *proof;
  } else {
    last_refusal_ = DescribeRefusedHello(hello, reply.verdict, params_);
    last_refusal_transient_ =
        reply.verdict == HandshakeVerdict::kWrongSession ||
        reply.verdict == HandshakeVerdict::kWrongWorldSize;
  }
  EncodeHandshake(reply, pending.bytes);
  pending.stage = Stage::kWritingVerdict;
  pending.done = 0;
  return absl::OkStatus();
}

void HelloAcceptor::CheckConfirmation(PendingHandshake& pending) {
  const Handshake& hello = pending.hello;
  Handshake confirmation;
  // A hello whose sender gave up while it waited in the accept queue (an
  // earlier attempt of this session) ends without a confirmation.
  if (!DecodeHandshake(pending.bytes, &confirmation) ||
      confirmation.verdict != HandshakeVerdict::kConfirmed ||
      confirmation.version != kWireVersion ||
      confirmation.session != params_.session ||
      confirmation.from_rank != hello.from_rank ||
      confirmation.to_rank != params_.rank ||
      confirmation.world_size != params_.world) {
    Drop(pending, "no matching confirmation");
    return;
  }
  HandshakeTranscript transcript;
  transcript.session = params_.session;
  transcript.connecting_rank = hello.from_rank;
  transcript.accepting_rank = params_.rank;
  transcript.world_size = params_.world;
  transcript.connecting_nonce = hello.nonce;
  transcript.accepting_nonce = pending.accepting_nonce;
  if (!VerifyMembership(params_.secret, ProvingSide::kConnectingRank,
                        transcript, confirmation.proof)) {
    last_refusal_ = absl::StrCat("refused a connection from ", pending.address,
                                 " claiming to be peer rank ", hello.from_rank,
                                 ": it failed the job's membership proof");
    last_refusal_transient_ = false;
    spdlog::warn("session={} rank={} {}", params_.session, params_.rank,
                 last_refusal_);
    pending.socket.Close();
    return;
  }
  absl::StatusOr<FrameKey> send =
      DeriveFrameKey(params_.secret, ProvingSide::kAcceptingRank, transcript);
  absl::StatusOr<FrameKey> receive =
      DeriveFrameKey(params_.secret, ProvingSide::kConnectingRank, transcript);
  if (!send.ok() || !receive.ok()) {
    Drop(pending, "its frame keys could not be derived");
    return;
  }
  // A rank opens a second connection to this one only after giving up on
  // the first, so the newest confirmed one is the live one.
  Connection& slot = sockets_[hello.from_rank];
  if (!slot.valid()) --missing_;
  slot.socket = std::move(pending.socket);
  slot.keys = {*send, *receive};
}

void HelloAcceptor::Drop(PendingHandshake& pending, const char* why) {
  spdlog::debug("session={} rank={} dropped a connection from {}: {}",
                params_.session, params_.rank, pending.address, why);
  pending.socket.Close();
}

absl::Status HelloAcceptor::Missing() const {
  if (missing_ == 0) return absl::OkStatus();
  std::vector<int> absent;
  for (const int peer : params_.accepted) {
    if (!sockets_[peer].valid()) absent.push_back(peer);
  }
  return absl::Status(
      last_refusal_.empty()     ? absl::StatusCode::kDeadlineExceeded
      : last_refusal_transient_ ? absl::StatusCode::kUnavailable
                                : absl::StatusCode::kFailedPrecondition,
      absl::StrCat("rank ", params_.rank, " waited connect_timeout ",
                   absl::FormatDuration(params_.connect_timeout),
                   " for peer ranks [", absl::StrJoin(absent, ", "),
                   "] to connect", last_refusal_.empty() ? "" : "; ",
                   last_refusal_));
}

}  // namespace

absl::Status AcceptHigherRanks(const Socket& listener, const MeshParams& params,
                               std::vector<Connection>* connections) {
  return HelloAcceptor(listener, params, connections).Run();
}

}  // namespace transport
}  // namespace muonps
