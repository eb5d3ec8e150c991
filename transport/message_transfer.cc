#include "transport/message_transfer.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace transport {
namespace {

// Where the two directions of one connection stand within the batch.
struct PeerState {
  std::vector<const OutgoingMessage*> outgoing;
  std::vector<const IncomingMessage*> incoming;
  size_t next_out = 0;
  // Of header, payload and tag of outgoing[next_out].
  size_t out_offset = 0;
  unsigned char out_header[kFrameHeaderBytes] = {};
  FrameTag out_tag = {};
  size_t next_in = 0;
  // Of header, payload and tag of incoming[next_in].
  size_t in_offset = 0;
  unsigned char in_header[kFrameHeaderBytes] = {};
  FrameTag in_tag = {};
  Deadline deadline;

  bool sending() const { return next_out < outgoing.size(); }
  bool receiving() const { return next_in < incoming.size(); }
};

size_t PayloadDone(size_t offset, uint64_t bytes) {
  return offset > kFrameHeaderBytes
             ? std::min<size_t>(offset - kFrameHeaderBytes, bytes)
             : 0;
}

size_t FrameBytes(const FrameHeader& header) {
  return kFrameHeaderBytes + header.bytes + kFrameTagBytes;
}

std::string DescribeProgress(const PeerState& state) {
  std::string text;
  if (state.sending()) {
    const FrameHeader& header = state.outgoing[state.next_out]->header;
    absl::StrAppend(&text, "sending ", MessageKindName(header.kind),
                    " message #", header.sequence, " (",
                    PayloadDone(state.out_offset, header.bytes), " of ",
                    header.bytes, " bytes)");
  }
  if (state.receiving()) {
    const FrameHeader& header = state.incoming[state.next_in]->expected;
    absl::StrAppend(&text, text.empty() ? "" : ", ", "receiving ",
                    MessageKindName(header.kind), " message #", header.sequence,
                    " (", PayloadDone(state.in_offset, header.bytes), " of ",
                    header.bytes, " bytes)");
  }
  return text;
}

absl::Status Lost(int peer, const PeerState& state, absl::string_view why) {
  return absl::UnavailableError(absl::StrCat(
      "peer rank ", peer, " ", why, " while ", DescribeProgress(state)));
}

absl::Status CheckHeader(int peer, const PeerState& state) {
  const FrameHeader& expected = state.incoming[state.next_in]->expected;
  FrameHeader got;
  if (!DecodeFrameHeader(state.in_header, &got)) {
    return absl::DataLossError(absl::StrCat(
        "peer rank ", peer,
        " sent bytes that are not a muonps frame header (bad magic; the "
        "stream is out of sync or not from a muonps rank) while ",
        DescribeProgress(state)));
  }
  if (got.kind == expected.kind && got.sequence == expected.sequence &&
      got.bytes == expected.bytes) {
    return absl::OkStatus();
  }
  const char* what = got.kind != expected.kind           ? "kind"
                     : got.sequence != expected.sequence ? "sequence number"
                     : got.bytes > expected.bytes        ? "length (larger)"
                                                         : "length (smaller)";
  return absl::InternalError(absl::StrCat(
      "peer rank ", peer, " sent ", MessageKindName(got.kind), " message #",
      got.sequence, " of ", got.bytes, " bytes where this rank expected ",
      MessageKindName(expected.kind), " message #", expected.sequence, " of ",
      expected.bytes, " bytes (", what,
      " differs; no payload byte was read): the ranks issued different "
      "calls"));
}

// Sends what the kernel takes without blocking; `moved` when any byte went.
absl::Status PumpOut(const Connection& connection, int peer, PeerState& state,
                     bool* moved) {
  const int fd = connection.socket.fd();
  while (state.sending()) {
    const OutgoingMessage& message = *state.outgoing[state.next_out];
    if (state.out_offset == 0) {
      EncodeFrameHeader(message.header, state.out_header);
      absl::StatusOr<FrameTag> tag =
          TagFrame(connection.keys.send, message.header, message.data,
                   message.header.bytes);
      if (!tag.ok()) return tag.status();
      state.out_tag = *tag;
    }
    iovec parts[3];
    int count = 0;
    if (state.out_offset < kFrameHeaderBytes) {
      parts[count++] = {state.out_header + state.out_offset,
                        kFrameHeaderBytes - state.out_offset};
    }
    const size_t done = PayloadDone(state.out_offset, message.header.bytes);
    if (done < message.header.bytes) {
      // sendmsg() only reads the payload; iovec just lacks a const member.
      parts[count++] = {
          const_cast<char*>(static_cast<const char*>(message.data)) + done,
          message.header.bytes - done};
    }
    const size_t tag_start = kFrameHeaderBytes + message.header.bytes;
    const size_t tag_done =
        state.out_offset > tag_start ? state.out_offset - tag_start : 0;
    parts[count++] = {state.out_tag.data() + tag_done,
                      kFrameTagBytes - tag_done};
    msghdr header = {};
    header.msg_iov = parts;
    header.msg_iovlen = count;
    const ssize_t sent = sendmsg(fd, &header, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      return Lost(peer, state,
                  absl::StrCat("dropped the connection (",
                               ConnectionError("send", errno).message(), ")"));
    }
    *moved = true;
    state.out_offset += static_cast<size_t>(sent);
    if (state.out_offset == FrameBytes(message.header)) {
      ++state.next_out;
      state.out_offset = 0;
    }
  }
  return absl::OkStatus();
}

// Receives what has arrived without blocking; `moved` when any byte came.
// A message's header is read whole and checked before any byte of its
// payload is read, so a garbled or unexpected frame never touches `data`.
absl::Status PumpIn(const Connection& connection, int peer, PeerState& state,
                    bool* moved) {
  const int fd = connection.socket.fd();
  while (state.receiving()) {
    const IncomingMessage& message = *state.incoming[state.next_in];
    const uint64_t bytes = message.expected.bytes;
    const size_t tag_start = kFrameHeaderBytes + bytes;
    const bool in_header = state.in_offset < kFrameHeaderBytes;
    const bool in_tag = state.in_offset >= tag_start;
    char* into =
        in_header ? reinterpret_cast<char*>(state.in_header) + state.in_offset
        : in_tag  ? reinterpret_cast<char*>(state.in_tag.data()) +
                       (state.in_offset - tag_start)
                 : static_cast<char*>(message.data) +
                       PayloadDone(state.in_offset, bytes);
    const size_t want = in_header ? kFrameHeaderBytes - state.in_offset
                        : in_tag
                            ? FrameBytes(message.expected) - state.in_offset
                            : bytes - PayloadDone(state.in_offset, bytes);
    const ssize_t got = recv(fd, into, want, 0);
    if (got == 0) return Lost(peer, state, "closed the connection");
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return absl::OkStatus();
      return Lost(peer, state,
                  absl::StrCat("dropped the connection (",
                               ConnectionError("recv", errno).message(), ")"));
    }
    *moved = true;
    state.in_offset += static_cast<size_t>(got);
    if (in_header && state.in_offset == kFrameHeaderBytes) {
      absl::Status header = CheckHeader(peer, state);
      if (!header.ok()) return header;
    }
    if (state.in_offset == FrameBytes(message.expected)) {
      if (!FrameTagMatches(connection.keys.receive, message.expected,
                           message.data, bytes, state.in_tag)) {
        return absl::UnauthenticatedError(absl::StrCat(
            "peer rank ", peer, "'s ", MessageKindName(message.expected.kind),
            " message #", message.expected.sequence, " of ", bytes,
            " bytes failed its authentication (its tag does not match: bytes "
            "altered or injected on the way); its payload is not used"));
      }
      ++state.next_in;
      state.in_offset = 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TransferMessages(const std::vector<Connection>& connections,
                              const std::vector<OutgoingMessage>& outgoing,
                              const std::vector<IncomingMessage>& incoming,
                              absl::Duration io_timeout,
                              absl::Duration call_timeout) {
  const int world = static_cast<int>(connections.size());
  std::vector<PeerState> states(connections.size());
  const auto connected = [&](int peer) {
    return peer >= 0 && peer < world && connections[peer].valid();
  };
  for (const OutgoingMessage& message : outgoing) {
    if (!connected(message.peer)) {
      return absl::InternalError(absl::StrCat("no connection to peer rank ",
                                              message.peer, " to send to"));
    }
    states[message.peer].outgoing.push_back(&message);
  }
  for (const IncomingMessage& message : incoming) {
    if (!connected(message.peer)) {
      return absl::InternalError(absl::StrCat(
          "no connection to peer rank ", message.peer, " to receive from"));
    }
    states[message.peer].incoming.push_back(&message);
  }
  // However a peer trickles bytes, the whole batch ends by this.
  const Deadline call_deadline = DeadlineAfter(call_timeout);
  const Deadline first_deadline =
      std::min(call_deadline, DeadlineAfter(io_timeout));
  for (PeerState& state : states) state.deadline = first_deadline;

  std::vector<pollfd> polled;
  std::vector<int> polled_peer;
  while (true) {
    polled.clear();
    polled_peer.clear();
    Deadline earliest = Deadline::max();
    for (int peer = 0; peer < world; ++peer) {
      const PeerState& state = states[peer];
      if (!state.sending() && !state.receiving()) continue;
      const short events = static_cast<short>((state.sending() ? POLLOUT : 0) |
                                              (state.receiving() ? POLLIN : 0));
      polled.push_back({connections[peer].socket.fd(), events, 0});
      polled_peer.push_back(peer);
      earliest = std::min(earliest, state.deadline);
    }
    if (polled.empty()) return absl::OkStatus();
    if (poll(polled.data(), polled.size(), MillisecondsUntil(earliest)) < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::ErrnoToStatus(errno, "poll").message());
    }
    for (size_t i = 0; i < polled.size(); ++i) {
      const short events = polled[i].revents;
      const int peer = polled_peer[i];
      PeerState& state = states[peer];
      if (events & POLLNVAL) {
        return absl::InternalError(
            absl::StrCat("connection to peer rank ", peer, " is not open"));
      }
      bool moved = false;
      if (state.receiving() && (events & (POLLIN | POLLHUP | POLLERR))) {
        absl::Status status = PumpIn(connections[peer], peer, state, &moved);
        if (!status.ok()) return status;
      }
      if (state.sending() && (events & (POLLOUT | POLLHUP | POLLERR))) {
        absl::Status status = PumpOut(connections[peer], peer, state, &moved);
        if (!status.ok()) return status;
      }
      if (moved) {
        state.deadline = std::min(call_deadline, DeadlineAfter(io_timeout));
      }
    }
    const Deadline now = std::chrono::steady_clock::now();
    for (int peer : polled_peer) {
      const PeerState& state = states[peer];
      if (!state.sending() && !state.receiving()) continue;
      if (now >= call_deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "peer rank ", peer, ": the call did not finish within ",
            absl::FormatDuration(call_timeout), " (call_timeout) while ",
            DescribeProgress(state)));
      }
      if (now >= state.deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("peer rank ", peer, ": nothing moved for ",
                         absl::FormatDuration(io_timeout),
                         " (io_timeout) while ", DescribeProgress(state)));
      }
    }
  }
}

}  // namespace transport
}  // namespace muonps
