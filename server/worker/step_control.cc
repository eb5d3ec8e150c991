#include "server/worker/step_control.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {

absl::Status ControlChannel::Broadcast(void* message, size_t bytes, int root) {
  if (bytes % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "control message of ", bytes, " bytes: not a whole number of floats"));
  }
  const size_t floats = bytes / sizeof(float);
  return Exchange(message, floats, [&](void* data) {
    return t_.Broadcast(data, floats, DType::kFloat32, root, stream_);
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
