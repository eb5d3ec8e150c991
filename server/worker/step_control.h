// ControlChannel: a step's small control messages (step_protocol.h) over the
// transport's control() (the data transport itself, or a host transport
// beside it: transport/split_transport.h). They live in host memory; a
// device transport (NCCL, CUDA IPC) gets them through a device buffer on
// the ops' stream(), and the call returns once the message moved (a host
// wait, bounded by the timeout), so the caller can read what arrived.
// Either way a message leaves only after the work enqueued on the ops'
// stream() before it is done, as it would behind it on that stream: over
// a host transport from a device, the call waits for the stream first.
// Used by one thread (the step's).
#ifndef MUONPS_SERVER_WORKER_STEP_CONTROL_H_
#define MUONPS_SERVER_WORKER_STEP_CONTROL_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "common/status.h"
#include "kernels/device_ops.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

class ControlChannel {
 public:
  // Everything must outlive the channel. `scratch` is a device buffer of
  // the transport's memory that messages pass through (ignored on the
  // host); a longer message gets its own.
  ControlChannel(transport::Transport* transport, kernels::DeviceOps* ops,
                 kernels::FloatBuffer* scratch, absl::Duration timeout)
      : data_(*transport),
        t_(*transport->control()),
        ops_(*ops),
        scratch_(scratch),
        timeout_(timeout),
        stream_(t_.memory() == MemoryKind::kHost ? kHostStream
                                                 : ops_.stream()) {}
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
  // Every rank's `mine` to `root` in one transport group (one launch and
  // one host wait, whatever the number of ranks). On the root `all` holds
  // them by rank, its own included; elsewhere it is left as it is. A
  // failure does not say which peer's message is missing.
  template <typename T>
  absl::Status Gather(const T& mine, std::vector<T>* all, int root) {
    constexpr size_t kFloats = FloatsOf<T>();
    if (t_.rank() != root) return Send(mine, root);
    const int size = t_.size();
    all->assign(size, T{});
    (*all)[root] = mine;
    return Exchange(all->data(), kFloats * size, [&](void* data) {
      MUONPS_RETURN_IF_ERROR(t_.GroupStart());
      absl::Status received;
      for (int r = 0; r < size && received.ok(); ++r) {
        if (r == root) continue;
        received = t_.Recv(static_cast<float*>(data) + r * kFloats, kFloats,
                           DType::kFloat32, r, stream_);
      }
      // Closed also after a refused call (the transport is broken then).
      const absl::Status ended = t_.GroupEnd();
      return received.ok() ? ended : received;
    });
  }
  template <typename T>
  absl::Status Broadcast(T* message, int root) {
    return Broadcast(message, FloatsOf<T>() * sizeof(float), root);
  }
  // `bytes` of host memory (an array of messages), a multiple of 4: they
  // travel as bytes / 4 fp32 elements. INVALID_ARGUMENT otherwise.
  absl::Status Broadcast(void* message, size_t bytes, int root);

 private:
  transport::Transport& data_;  // what the stream waits on (bounded)
  transport::Transport& t_;     // where the messages go
  kernels::DeviceOps& ops_;
  kernels::FloatBuffer* const scratch_;
  const absl::Duration timeout_;
  // What the control transport's calls are ordered on: kHostStream for a
  // host transport, the ops' stream() for a device one.
  const Stream stream_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_CONTROL_H_
