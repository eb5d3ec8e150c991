// Moving one batch of framed messages over a transport's connections. Every
// message to or from every peer progresses at once through a single poll()
// loop on the calling thread, so ranks that all send large messages before
// receiving cannot block one another on full socket buffers; messages to one
// peer go out, and messages from one peer are expected, in the order given.
// Each message travels as a FrameHeader (wire_format.h), its payload and its
// tag (frame_auth.h), under the connection's keys.
// Thread-compatible: one batch per set of connections at a time.
#ifndef MUONPS_TRANSPORT_MESSAGE_TRANSFER_H_
#define MUONPS_TRANSPORT_MESSAGE_TRANSFER_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "transport/frame_auth.h"
#include "transport/socket_io.h"
#include "transport/wire_format.h"

namespace muonps {
namespace transport {

// `header.bytes` bytes at `data` (unowned; untouched until the transfer
// returns) for rank `peer`.
struct OutgoingMessage {
  int peer = -1;
  FrameHeader header;
  const void* data = nullptr;
};

// A message from rank `peer` whose header must equal `expected`; its
// `expected.bytes` payload bytes land at `data` (unowned).
struct IncomingMessage {
  int peer = -1;
  FrameHeader expected;
  void* data = nullptr;
};

// Sends every `outgoing` and receives every `incoming` message over
// `connections` (indexed by rank; non-blocking, valid for every peer
// named), each tagged with the sending direction's key.
// OK once every outgoing message is handed to the kernel whole and every
// incoming one has arrived whole. Otherwise the first failure, naming the
// peer rank and the message: UNAVAILABLE when the peer closed or reset the
// connection; DEADLINE_EXCEEDED when no byte moved to or from a peer with
// messages pending for `io_timeout`, or when the whole batch is not done
// `call_timeout` after the call began (a peer trickling bytes cannot extend
// it); DATA_LOSS when the bytes where a frame header belongs are not one
// (bad magic); INTERNAL when an arriving header is not the expected one
// (kind, sequence number or length differ: the ranks issued different
// calls, or a peer sent more than the receiver expects); UNAUTHENTICATED
// naming the peer rank and the message when its tag does not verify (its
// bytes were altered or injected on the way: its payload must not be used).
// Every header is
// read whole and checked before any payload byte is read, so after a
// failure an incoming buffer whose header failed its check, or had not yet
// arrived, is untouched; one whose payload had begun to arrive holds
// unspecified bytes. The connections on which messages were left partly
// moved are out of step.
absl::Status TransferMessages(const std::vector<Connection>& connections,
                              const std::vector<OutgoingMessage>& outgoing,
                              const std::vector<IncomingMessage>& incoming,
                              absl::Duration io_timeout,
                              absl::Duration call_timeout);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_MESSAGE_TRANSFER_H_
