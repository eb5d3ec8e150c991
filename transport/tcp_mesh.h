// Opening the connections of one transport session: one TCP connection per
// pair of ranks, the lower rank accepting on its listener and the higher rank
// connecting (retrying until the peer listens and answers). Each connection
// is confirmed by a three-step Handshake (wire_format.h): the connecting
// rank's hello names the wire version, the session, both ranks and the world
// size; the accepting rank answers with a verdict; the connecting rank
// confirms an acceptance. The accepting rank refuses a hello that disagrees
// with it (a stale connection left from an older session, one meant for
// another rank, another world size), saying why, and keeps waiting for the
// right one; it also drops an accepted hello that is never confirmed (an
// earlier attempt of this session whose sender gave up while it sat in the
// accept queue). The connecting rank retries a refused hello until its
// deadline, since its peer may not have moved to the new session yet.
// Thread-compatible: one ConnectMesh per listener at a time.
#ifndef MUONPS_TRANSPORT_TCP_MESH_H_
#define MUONPS_TRANSPORT_TCP_MESH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/socket_io.h"

namespace muonps {
namespace transport {

// Connects `rank` to every other rank of `addresses` (index = rank, including
// this one; its own entry is not used) for `session`. `listener` is this
// rank's listening socket (unused by the highest rank). Returns non-blocking
// sockets indexed by rank, this rank's entry empty, once every pair has
// completed the handshake. Reading one incoming hello is bounded by
// `handshake_timeout`, so a silent connection cannot hold up the others.
// Errors, when `connect_timeout` passes first (each names the ranks and the
// addresses involved): FAILED_PRECONDITION when the last failure was a
// handshake refused for disagreeing, the message saying which values differ
// (for example "session 7, this rank is on session 8"); DEADLINE_EXCEEDED
// when a peer never answered. Sockets opened before a failure are closed.
absl::StatusOr<std::vector<Socket>> ConnectMesh(
    const Socket& listener, int rank, const std::vector<HostPort>& addresses,
    uint64_t session, absl::Duration connect_timeout,
    absl::Duration handshake_timeout);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_TCP_MESH_H_
