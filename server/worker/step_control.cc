#include "server/worker/step_control.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {

ControlChannel::ControlChannel(transport::Transport* transport,
                               kernels::DeviceOps* ops,
                               kernels::FloatBuffer* scratch,
                               absl::Duration timeout)
    : data_(*transport),
      t_(*transport->control()),
      ops_(*ops),
      scratch_(scratch),
      timeout_(timeout),
      stream_(t_.memory() == MemoryKind::kHost ? kHostStream : ops_.stream()),
      tree_(t_.tree()),
      subtree_(tree_.Preorder(t_.rank())) {
  size_t first = 1;
  for (const int child : tree_.Children(t_.rank())) {
    children_.emplace_back(child, first);
    first += tree_.Preorder(child).size();
  }
}

absl::Status ControlChannel::GatherSubtree(void* subtree, size_t floats) {
  return Exchange(subtree, floats * subtree_.size(), [&](void* data) {
    float* const at = static_cast<float*>(data);
    if (!children_.empty()) {
      MUONPS_RETURN_IF_ERROR(t_.GroupStart());
      absl::Status received;
      for (size_t i = 0; i < children_.size() && received.ok(); ++i) {
        const size_t end = i + 1 < children_.size() ? children_[i + 1].second
                                                    : subtree_.size();
        const size_t first = children_[i].second;
        received = t_.Recv(at + first * floats, (end - first) * floats,
                           DType::kFloat32, children_[i].first, stream_);
      }
      // Closed also after a refused call (the transport is broken then).
      const absl::Status ended = t_.GroupEnd();
      MUONPS_RETURN_IF_ERROR(received);
      MUONPS_RETURN_IF_ERROR(ended);
    }
    if (t_.rank() == 0) return absl::OkStatus();
    return t_.Send(at, floats * subtree_.size(), DType::kFloat32,
                   tree_.Parent(t_.rank()), stream_);
  });
}

absl::Status ControlChannel::BroadcastBytes(void* message, size_t bytes,
                                            int root, bool* arrived) {
  if (arrived != nullptr) *arrived = false;
  if (bytes % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control message of ", bytes, " bytes: not a whole number of floats"));
  }
  if (root < 0 || root >= t_.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control broadcast from rank ", root, ": not one of ", t_.size()));
  }
  const size_t floats = bytes / sizeof(float);
  const int rank = t_.rank();
  const int from = rank == root ? -1 : tree_.Toward(rank, root);
  if (from >= 0) {
    MUONPS_RETURN_IF_ERROR(Exchange(message, floats, [&](void* data) {
      return t_.Recv(data, floats, DType::kFloat32, from, stream_);
    }));
  }
  if (arrived != nullptr) *arrived = true;
  std::vector<int> onward = tree_.Children(rank);
  if (rank != 0) onward.push_back(tree_.Parent(rank));
  onward.erase(std::remove(onward.begin(), onward.end(), from), onward.end());
  if (onward.empty()) return absl::OkStatus();
  return Exchange(message, floats, [&](void* data) {
    MUONPS_RETURN_IF_ERROR(t_.GroupStart());
    absl::Status sent;
    for (size_t i = 0; i < onward.size() && sent.ok(); ++i) {
      sent = t_.Send(data, floats, DType::kFloat32, onward[i], stream_);
    }
    const absl::Status ended = t_.GroupEnd();
    return sent.ok() ? ended : sent;
  });
}

absl::Status ControlChannel::Exchange(
    void* host, size_t count,
    const std::function<absl::Status(void* data)>& move) {
  if (t_.memory() == MemoryKind::kHost) {
    // After the stream's work, as a message on the stream would be.
    // Bounded by the data transport: a stream stuck on a lost peer's
    // transfer fails here within the timeout.
    if (ops_.device().is_cuda()) {
      MUONPS_RETURN_IF_ERROR(data_.Synchronize(ops_.stream(), timeout_));
    }
    return move(host);
  }
  const int64_t floats = static_cast<int64_t>(count);
  std::unique_ptr<kernels::FloatBuffer> larger;
  float* device = scratch_->data();
  if (scratch_->size() < floats) {  // a long list of sizes
    MUONPS_ASSIGN_OR_RETURN(larger, ops_.Allocate(floats, "control message"));
    device = larger->data();
  }
  const Stream stream = ops_.stream();
  MUONPS_RETURN_IF_ERROR(
      ops_.Copy(device, static_cast<const float*>(host), floats, stream));
  MUONPS_RETURN_IF_ERROR(move(device));
  MUONPS_RETURN_IF_ERROR(t_.Synchronize(stream, timeout_));
  MUONPS_RETURN_IF_ERROR(
      ops_.Copy(static_cast<float*>(host), device, floats, stream));
  return ops_.Synchronize(stream);
}

}  // namespace worker
}  // namespace muonps
