// Opening the connections of one transport session: one TCP connection per
// pair of ranks, the lower rank accepting on its listener and the higher rank
// connecting (retrying until the peer listens and answers). Each connection
// is confirmed by a three-step Handshake (wire_format.h) that also proves
// both ends hold the job's data-plane secret (membership_proof.h):
//   1. hello (connecting rank): wire version, session, both ranks, world
//      size, a fresh nonce;
//   2. verdict (accepting rank): on acceptance, its own fresh nonce and its
//      proof over both nonces and those fields, which the connecting rank
//      checks before sending anything else;
//   3. confirmation (connecting rank): its proof over the same.
// The accepting rank refuses a hello that disagrees with it (a stale
// connection left from an older session, one meant for another rank,
// another world size), saying why, and drops an accepted hello that is never
// confirmed (an earlier attempt whose sender gave up while it sat in the
// accept queue) or whose confirmation fails the proof (an impostor, or a
// replay of a recorded handshake: the acceptor's nonce is new), keeping on
// waiting for the right peer; it handles every pending connection at once
// (mesh_acceptor.h). The connecting rank retries a refused hello, or an
// acceptance failing the proof, until its deadline, since its peer may not
// have moved to the new session yet.
// Thread-compatible: one ConnectMesh per listener at a time.
#ifndef MUONPS_TRANSPORT_TCP_MESH_H_
#define MUONPS_TRANSPORT_TCP_MESH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/rank_tree.h"
#include "transport/frame_auth.h"
#include "transport/socket_io.h"

namespace muonps {
namespace transport {

// Which pairs of ranks a mesh connects.
struct MeshShape {
  // Every pair.
  static MeshShape Full() { return MeshShape{}; }
  // Each rank with its parent and its children in a RankTree of `fanout`
  // (rank_tree.h), and no other pair: for messages that pass along the tree
  // (a step's control rounds), N - 1 connections rather than N (N - 1) / 2,
  // each rank but 0 opening one, and at most fanout + 1 on any rank.
  static MeshShape Tree(int fanout) { return MeshShape{fanout}; }

  bool full() const { return tree_fanout == 0; }
  // The tree a mesh of `size` ranks connects: a star on a full mesh.
  RankTree tree(int size) const {
    return full() ? RankTree::Star(size) : RankTree(size, tree_fanout);
  }
  // Whether ranks `a` and `b` of a mesh of `size` ranks are connected.
  bool Connects(int a, int b, int size) const {
    return full() || tree(size).Connects(a, b);
  }

  int tree_fanout = 0;  // 0: every pair
};

// Connects `rank` to every other rank of `addresses` (index = rank, including
// this one; its own entry is not used) for `session`, proving membership
// with `secret` (the job's data-plane secret, already checked to be long
// enough; copied, never logged). `listener` is this rank's listening socket
// (unused by the highest rank). Returns non-blocking connections indexed by
// rank, this rank's entry empty, with the frame keys each handshake gave
// (frame_auth.h), once every pair has completed the handshake. Each accepted
// connection has `handshake_timeout` to complete its handshake, while the
// others proceed. Errors, when `connect_timeout` passes first (each names the
// ranks and the addresses involved): FAILED_PRECONDITION when the last failure
// was a handshake refused for disagreeing, the message saying which values
// differ (for example "session 7, this rank is on session 8"), or one that
// failed the job's membership proof; DEADLINE_EXCEEDED when a peer never
// answered. Sockets opened before a failure are closed. On a tree mesh
// (`shape`) only parents and children are connected: the other entries stay
// empty too.
absl::StatusOr<std::vector<Connection>> ConnectMesh(
    const Socket& listener, int rank, const std::vector<HostPort>& addresses,
    uint64_t session, absl::string_view secret, absl::Duration connect_timeout,
    absl::Duration handshake_timeout, MeshShape shape);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_TCP_MESH_H_
