// ControlChannel: a step's small control messages (step_protocol.h) over the
// transport's control() (the data transport itself, or a host transport
// beside it: transport/split_transport.h). They live in host memory; a
// device transport (NCCL, CUDA IPC) gets them through a device buffer on
// the ops' stream(), and the call returns once the message moved (a host
// wait, bounded by the timeout), so the caller can read what arrived.
// Either way a message leaves only after the work enqueued on the ops'
// stream() before it is done, as it would behind it on that stream: over
// a host transport from a device, the call waits for the stream first.
//
// Gathers and broadcasts pass along the control transport's tree
// (Transport::tree(), transport/rank_tree.h), from neighbor to neighbor: a
// star where every pair of ranks is connected (one hop, rank 0 exchanging
// with every rank), and on a GPU worker's control mesh a tree of
// kControlTreeFanout, so that no rank handles more than fanout + 1
// messages a round however many ranks the job has.
// Used by one thread (the step's).
#ifndef MUONPS_SERVER_WORKER_STEP_CONTROL_H_
#define MUONPS_SERVER_WORKER_STEP_CONTROL_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/rank_tree.h"
#include "common/status.h"
#include "kernels/device_ops.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// The fanout of a GPU worker's control mesh (transport::MeshShape::Tree).
// Up to 17 ranks it is a star; at 1024 ranks a round passes 3 hops each
// way, and rank 0 handles 32 messages instead of 2046 (each costs a rank
// 5-7 us of host time: bench/control_rounds).
constexpr int kControlTreeFanout = 16;

class ControlChannel {
 public:
  // Everything must outlive the channel. `scratch` is a device buffer of
  // the transport's memory that messages pass through (ignored on the
  // host); a longer message gets its own.
  ControlChannel(transport::Transport* transport, kernels::DeviceOps* ops,
                 kernels::FloatBuffer* scratch, absl::Duration timeout);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Control messages travel as fp32 elements (DType::kFloat32): their bytes,
  // unconverted, sizeof(T) / 4 floats of them. A message type must be a
  // whole number of floats.
  template <typename T>
  static constexpr size_t FloatsOf() {
    static_assert(sizeof(T) % sizeof(float) == 0,
                  "a control message travels as whole fp32 elements");
    return sizeof(T) / sizeof(float);
  }

  // Moves `floats` fp32 elements of host memory through the transport's
  // memory: `move` runs the transport calls on the staged copy, on the ops'
  // stream(); what arrived is back in `host` on return.
  absl::Status Exchange(void* host, size_t floats,
                        const std::function<absl::Status(void* data)>& move);

  template <typename T>
  absl::Status Send(const T& message, int peer) {
    constexpr size_t kFloats = FloatsOf<T>();
    T copy = message;
    return Exchange(&copy, kFloats, [&](void* data) {
      return t_.Send(data, kFloats, DType::kFloat32, peer, stream_);
    });
  }
  template <typename T>
  absl::Status Recv(T* message, int peer) {
    constexpr size_t kFloats = FloatsOf<T>();
    return Exchange(message, kFloats, [&](void* data) {
      return t_.Recv(data, kFloats, DType::kFloat32, peer, stream_);
    });
  }
  // Every rank's `mine` to rank 0 along the tree: each rank receives its
  // children's subtrees in one transport group (one launch and one host
  // wait, whatever their number), then passes its own subtree on to its
  // parent as one message. On rank 0 `all` holds them by rank, its own
  // included; elsewhere it is left as it is. A failure does not say which
  // rank's message is missing.
  template <typename T>
  absl::Status Gather(const T& mine, std::vector<T>* all) {
    constexpr size_t kFloats = FloatsOf<T>();
    std::vector<T> subtree(subtree_.size());
    subtree[0] = mine;
    MUONPS_RETURN_IF_ERROR(GatherSubtree(subtree.data(), kFloats));
    if (t_.rank() != 0) return absl::OkStatus();
    all->assign(subtree.size(), T{});
    for (size_t i = 0; i < subtree.size(); ++i) {
      (*all)[subtree_[i]] = subtree[i];
    }
    return absl::OkStatus();
  }
  // `root`'s message to every rank along the tree: each rank receives it
  // from its neighbor toward `root` and passes it on to its other
  // neighbors in one group. `arrived` (may be null) is set once it is in
  // `message`, so a rank that failed to pass on what it received knows
  // it has it.
  template <typename T>
  absl::Status Broadcast(T* message, int root, bool* arrived = nullptr) {
    return BroadcastBytes(message, FloatsOf<T>() * sizeof(float), root,
                          arrived);
  }
  // `bytes` of host memory (an array of messages), a multiple of 4: they
  // travel as bytes / 4 fp32 elements. INVALID_ARGUMENT otherwise, or for
  // a root that is not a rank.
  absl::Status BroadcastBytes(void* message, size_t bytes, int root,
                              bool* arrived = nullptr);

  // The tree the messages pass along.
  const RankTree& tree() const { return tree_; }

 private:
  // `subtree` holds this rank's subtree's messages in preorder (its own
  // first), `floats` each: its children's arrive, then it goes on to the
  // parent.
  absl::Status GatherSubtree(void* subtree, size_t floats);

  transport::Transport& data_;  // what the stream waits on (bounded)
  transport::Transport& t_;     // where the messages go
  kernels::DeviceOps& ops_;
  kernels::FloatBuffer* const scratch_;
  const absl::Duration timeout_;
  // What the control transport's calls are ordered on: kHostStream for a
  // host transport, the ops' stream() for a device one.
  const Stream stream_;
  const RankTree tree_;
  // This rank's subtree in preorder (RankTree::Preorder), and
  // where each child's begins in it.
  const std::vector<int> subtree_;
  std::vector<std::pair<int, size_t>> children_;  // {rank, first index}
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_CONTROL_H_
