// ControlChannel: a step's small control messages (step_protocol.h) over the
// data transport. They live in host memory; a device transport (NCCL, CUDA
// IPC) gets them through a device buffer on the ops' stream(), and the call
// returns once the message moved (a host wait, bounded by the timeout), so
// the caller can read what arrived. Used by one thread (the step's).
#ifndef MUONPS_SERVER_WORKER_STEP_CONTROL_H_
#define MUONPS_SERVER_WORKER_STEP_CONTROL_H_

#include <cstddef>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
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
      : t_(*transport), ops_(*ops), scratch_(scratch), timeout_(timeout) {}
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Moves `bytes` (a multiple of 4) of host memory through the transport's
  // memory: `exchange` runs the transport calls on the staged copy, on the
  // ops' stream(); what arrived is back in `host` on return.
  absl::Status Exchange(void* host, size_t bytes,
                        const std::function<absl::Status(void* data)>& move);

  template <typename T>
  absl::Status Send(const T& message, int peer) {
    T copy = message;
    return Exchange(&copy, sizeof(T), [&](void* data) {
      return t_.Send(data, sizeof(T), peer, ops_.stream());
    });
  }
  template <typename T>
  absl::Status Recv(T* message, int peer) {
    return Exchange(message, sizeof(T), [&](void* data) {
      return t_.Recv(data, sizeof(T), peer, ops_.stream());
    });
  }
  template <typename T>
  absl::Status Broadcast(T* message, int root) {
    return Broadcast(message, sizeof(T), root);
  }
  absl::Status Broadcast(void* message, size_t bytes, int root) {
    return Exchange(message, bytes, [&](void* data) {
      return t_.Broadcast(data, bytes, root, ops_.stream());
    });
  }

 private:
  transport::Transport& t_;
  kernels::DeviceOps& ops_;
  kernels::FloatBuffer* const scratch_;
  const absl::Duration timeout_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_CONTROL_H_
