// DeviceOps: the memory and elementwise work of a worker's step besides
// momentum and Newton-Schulz (MuonKernels), on one device and ordered on
// streams: owned fp32 buffers, copies, conversions of lent bf16 tensors to
// and from fp32, the mean's scaling, the scaled update, and the finite
// check of gradients. The CPU implementation
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
#include "common/dtype.h"

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

// OK for the element types lent tensors may have (fp32, bf16);
// INVALID_ARGUMENT naming `dtype` otherwise.
absl::Status CheckLentDType(DType dtype);

// `elements` elements of `dtype` past `data` (byte arithmetic on a lent
// tensor of either type).
inline void* ElementsPast(void* data, DType dtype, int64_t elements) {
  return static_cast<char*>(data) + elements * DTypeSize(dtype);
}
inline const void* ElementsPast(const void* data, DType dtype,
                                int64_t elements) {
  return static_cast<const char*>(data) + elements * DTypeSize(dtype);
}

class DeviceOps {
 public:
  DeviceOps() = default;
  DeviceOps(const DeviceOps&) = delete;
  DeviceOps& operator=(const DeviceOps&) = delete;
  virtual ~DeviceOps() = default;

  virtual Device device() const = 0;
  // The streams of a step: stream() carries transfers and the trainer's
  // signals, compute_stream() momentum and Newton-Schulz, so that one
  // bucket's transfers overlap another's compute. kHostStream for both on
  // the host.
  virtual Stream stream() const = 0;
  virtual Stream compute_stream() const = 0;
  // Marks: points in a stream's work that another stream waits for later,
  // and that time a step. Mark(stream) records mark number i (0, 1, ...
  // since the last ClearMarks) at the end of the work enqueued on `stream`
  // so far (CUDA: an event recorded there; host: the clock now) and
  // returns i. WaitForMark(waiter, i): work enqueued on `waiter` after this
  // call starts only once the work before mark i is done. MarkTimesMs waits
  // for every mark and returns each one's time in ms after mark 0.
  // ClearMarks forgets them (one step's marks at a time).
  virtual absl::StatusOr<int> Mark(Stream stream) = 0;
  virtual absl::Status WaitForMark(Stream waiter, int mark) = 0;
  virtual absl::StatusOr<std::vector<double>> MarkTimesMs() = 0;
  virtual void ClearMarks() = 0;

  // `count` zeroed floats; RESOURCE_EXHAUSTED naming `what` when the device
  // is full. Synchronous (allocation is not on the step's hot path).
  virtual absl::StatusOr<std::unique_ptr<FloatBuffer>> Allocate(
      int64_t count, const char* what) = 0;
  // dst[i] <- src[i] for `count` floats (non-overlapping). Either side may
  // also be host memory (checkpoints, control messages); such a copy may
  // block until done.
  virtual absl::Status Copy(float* dst, const float* src, int64_t count,
                            Stream stream) = 0;
  // `bytes` bytes from src to dst (non-overlapping), either of which may be
  // another device's memory mapped here (a peer's window,
  // server/worker/staging_windows.h): on a GPU, the copy engines move them.
  virtual absl::Status CopyBytes(void* dst, const void* src, int64_t bytes,
                                 Stream stream) = 0;
  // dst[i] <- float(src[i]) for `count` elements of `src_dtype` (any DType;
  // fp32 is a copy). Device memory on both sides.
  virtual absl::Status ToFloat(float* dst, const void* src, DType src_dtype,
                               int64_t count, Stream stream) = 0;
  // dst[i] <- src[i] rounded to `dst_dtype` (any DType; round to nearest
  // even, as torch's .to(torch.bfloat16) and .to(torch.float16)).
  virtual absl::Status FromFloat(void* dst, DType dst_dtype, const float* src,
                                 int64_t count, Stream stream) = 0;
  // data[i] <- data[i] * factor (fp32).
  virtual absl::Status Scale(float* data, int64_t count, float factor,
                             Stream stream) = 0;
  // param[i] <- param[i] * decay + step * float(update[i]), computed in fp32
  // in that order and rounded once to `param_dtype`. Parameters are lent
  // tensors (fp32 or bf16: INVALID_ARGUMENT naming `dtype` for another);
  // the update is of any DType (a Muon update travels in the precision
  // Newton-Schulz ran in: MuonKernels::update_dtype).
  virtual absl::Status ApplyScaled(void* param, DType param_dtype,
                                   const void* update, DType update_dtype,
                                   int64_t count, float decay, float step,
                                   Stream stream) = 0;
  // Finite checks that run beside other work, over spans numbered from 0,
  // all on one stream: PrepareFiniteChecks makes room for `count` of them
  // and clears them in `stream` order; CheckFinite enqueues the search of
  // spans[k] as number first + k; FiniteResults gives, for numbers
  // [0, count), the index of each span's first non-finite element, or -1
  // for a finite span or one never checked, waiting for `stream` (one host
  // synchronization for all).
  virtual absl::Status PrepareFiniteChecks(int64_t count, Stream stream) = 0;
  virtual absl::Status CheckFinite(absl::Span<const FloatSpan> spans,
                                   int64_t first, Stream stream) = 0;
  virtual absl::StatusOr<std::vector<int64_t>> FiniteResults(int64_t count,
                                                             Stream stream) = 0;
  // Waits until everything enqueued on `stream` is done; returns any
  // asynchronous error of that work.
  virtual absl::Status Synchronize(Stream stream) = 0;
};

// An owned block of `size()` elements of one DType on a device (a
// FloatBuffer holds its bytes), zero-filled when allocated. Empty (null)
// until Allocate; movable.
class TypedBuffer {
 public:
  TypedBuffer() = default;
  // RESOURCE_EXHAUSTED naming `what` when the device is full.
  static absl::StatusOr<TypedBuffer> Allocate(DeviceOps& ops, DType dtype,
                                              int64_t count, const char* what);
  // `count` elements of `dtype` in `block`, which must hold their bytes
  // (INVALID_ARGUMENT otherwise).
  static absl::StatusOr<TypedBuffer> Wrap(std::unique_ptr<FloatBuffer> block,
                                          DType dtype, int64_t count);

  DType dtype() const { return dtype_; }
  int64_t size() const { return size_; }
  explicit operator bool() const { return block_ != nullptr; }
  // Element `element` (byte arithmetic by dtype()).
  void* at(int64_t element) const {
    return ElementsPast(block_->data(), dtype_, element);
  }

 private:
  std::unique_ptr<FloatBuffer> block_;
  DType dtype_ = DType::kFloat32;
  int64_t size_ = 0;
};

}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_DEVICE_OPS_H_
