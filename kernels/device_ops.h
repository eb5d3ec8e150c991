// DeviceOps: the memory and elementwise work of a worker's step besides
// momentum and Newton-Schulz (MuonKernels), on one device and ordered on
// streams: owned fp32 buffers, copies, the mean's scaling, the scaled
// update, and the finite check of lent gradients. The CPU implementation
// (kernels/cpu/cpu_device_ops.h) runs on host memory with kHostStream; the
// CUDA one (kernels/cuda/cuda_device_ops.h) enqueues on CUDA streams.
//
// Contract (NCCL's rule): every call names its stream and returns once the
// work is enqueued; it is done when the stream reaches it. Pointers are on
// device(). The arithmetic of Scale and ApplyScaled is the same fp32
// operation sequence on every backend, so CPU and GPU agree bit for bit on
// the same inputs. Not safe for concurrent use; one step thread uses it.
#ifndef MUONPS_KERNELS_DEVICE_OPS_H_
#define MUONPS_KERNELS_DEVICE_OPS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/device.h"

namespace muonps {
namespace kernels {

// An owned block of fp32 values on a device, zero-filled when allocated.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  virtual ~FloatBuffer() = default;

  virtual float* data() const = 0;
  virtual int64_t size() const = 0;
};

// `count` floats at `data` (device memory of the ops' device).
struct FloatSpan {
  const float* data = nullptr;
  int64_t count = 0;
};

class DeviceOps {
 public:
  DeviceOps() = default;
  DeviceOps(const DeviceOps&) = delete;
  DeviceOps& operator=(const DeviceOps&) = delete;
  virtual ~DeviceOps() = default;

  virtual Device device() const = 0;
  // The stream work is ordered on: kHostStream for the host.
  virtual Stream stream() const = 0;

  // `count` zeroed floats; RESOURCE_EXHAUSTED naming `what` when the device
  // is full. Synchronous (allocation is not on the step's hot path).
  virtual absl::StatusOr<std::unique_ptr<FloatBuffer>> Allocate(
      int64_t count, const char* what) = 0;
  // dst[i] <- src[i] for `count` floats (non-overlapping). Either side may
  // also be host memory (checkpoints, control messages); such a copy may
  // block until done.
  virtual absl::Status Copy(float* dst, const float* src, int64_t count,
                            Stream stream) = 0;
  // data[i] <- data[i] * factor (fp32).
  virtual absl::Status Scale(float* data, int64_t count, float factor,
                             Stream stream) = 0;
  // param[i] <- param[i] * decay + step * update[i] (fp32, in that order).
  virtual absl::Status ApplyScaled(float* param, const float* update,
                                   int64_t count, float decay, float step,
                                   Stream stream) = 0;
  // For every span, the index of its first non-finite element, or -1.
  // Waits for `stream` (one host synchronization for all spans).
  virtual absl::StatusOr<std::vector<int64_t>> FirstNonFinite(
      absl::Span<const FloatSpan> spans, Stream stream) = 0;
  // Waits until everything enqueued on `stream` is done; returns any
  // asynchronous error of that work.
  virtual absl::Status Synchronize(Stream stream) = 0;
};

}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_DEVICE_OPS_H_
