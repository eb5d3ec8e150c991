// The accepting half of ConnectMesh (tcp_mesh.h): a rank takes the
// connections of the higher ranks it accepts (every one on a full mesh, its
// children on a tree) on its listener and runs the accepting
// side of the handshake on each (wire_format.h, membership_proof.h).
//
// Concurrency. One poll() loop on the calling thread watches the listener
// and every accepted connection still in its handshake, and advances each
// connection's handshake as its bytes arrive, so an idle, slow or garbage
// connection never delays another: the real peers' hellos are answered the
// moment they arrive, whatever else is pending. A pending connection that
// does not complete its handshake within `handshake_timeout` of its accept
// (capped by the mesh deadline) is closed. At most kMaxPendingHandshakes
// connections, or as many as peers are still missing where that is more,
// are pending at once; a newer one evicts the oldest, so a
// flood of idle connections cannot stop the listener from being drained
// (a real peer finishes its handshake within a round trip and, if evicted
// anyway, retries). No thread is started.
//
// Refusals. A hello that disagrees (version, session, world size, rank) is
// answered with the verdict and closed; one whose sender never confirms the
// acceptance (an abandoned attempt) or whose confirmation fails the job's
// membership proof (logged at warn with its address) is closed. In every
// case the rank keeps waiting for the right peer.
#ifndef MUONPS_TRANSPORT_MESH_ACCEPTOR_H_
#define MUONPS_TRANSPORT_MESH_ACCEPTOR_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "transport/frame_auth.h"
#include "transport/socket_io.h"

namespace muonps {
namespace transport {

constexpr size_t kMaxPendingHandshakes = 64;

// What one rank brings to ConnectMesh.
struct MeshParams {
  int rank = 0;
  int world = 0;
  uint64_t session = 0;
  // The job's data-plane secret (checked by the caller); never logged.
  std::string secret;
  // Of the whole ConnectMesh call.
  Deadline deadline;
  // For messages: what `deadline` was computed from.
  absl::Duration connect_timeout;
  // Per accepted connection, from its accept to its confirmation.
  absl::Duration handshake_timeout;
  // The higher ranks this rank accepts, ascending; a hello from any other
  // is refused.
  std::vector<int> accepted;
};

// Accepts params.accepted on `listener` until each has
// completed the handshake, storing each connection (non-blocking) at
// (*connections)[peer rank] with its frame keys (frame_auth.h);
// `connections` has params.world entries. OK once every
// accepted rank is connected; when params.deadline passes first,
// FAILED_PRECONDITION if a hello was refused or failed the membership proof
// (the message says which, the last one seen), DEADLINE_EXCEEDED otherwise,
// naming the missing ranks. UNAVAILABLE if the listener fails, INTERNAL if
// poll() or libcrypto does.
absl::Status AcceptHigherRanks(const Socket& listener, const MeshParams& params,
                               std::vector<Connection>* connections);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_MESH_ACCEPTOR_H_
