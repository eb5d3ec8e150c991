// DeviceOps on one CUDA device: cudaMemcpyAsync and the fused elementwise
// kernels of kernels/cuda/elementwise.h, enqueued on the stream each call
// names (a stream of this device). stream() is one the object creates
// (non-blocking) unless the caller hands one in; compute_stream() is always
// its own.
//
// Thread rule: one thread at a time; not copyable. Create returns
// UNAVAILABLE without a usable GPU (never a crash on a CPU-only machine).
#ifndef MUONPS_KERNELS_CUDA_CUDA_DEVICE_OPS_H_
#define MUONPS_KERNELS_CUDA_CUDA_DEVICE_OPS_H_

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "kernels/cuda/device_buffer.h"
#include "kernels/device_ops.h"

namespace muonps {
namespace kernels {
namespace cuda {

class CudaDeviceOps final : public DeviceOps {
 public:
  // `stream` null: creates and owns a non-blocking stream on `device`.
  static absl::StatusOr<std::unique_ptr<CudaDeviceOps>> Create(
      int device, cudaStream_t stream = nullptr);
  ~CudaDeviceOps() override;

  Device device() const override { return {MemoryKind::kCuda, device_}; }
  Stream stream() const override { return stream_; }
  Stream compute_stream() const override { return compute_stream_; }
  absl::StatusOr<int> Mark(Stream stream) override;
  absl::Status WaitForMark(Stream waiter, int mark) override;
  absl::StatusOr<std::vector<double>> MarkTimesMs() override;
  void ClearMarks() override { marks_used_ = 0; }
  absl::StatusOr<std::unique_ptr<FloatBuffer>> Allocate(
      int64_t count, const char* what) override;
  absl::Status Copy(float* dst, const float* src, int64_t count,
                    Stream stream) override;
  absl::Status CopyBytes(void* dst, const void* src, int64_t bytes,
                         Stream stream) override;
  absl::Status ToFloat(float* dst, const void* src, DType src_dtype,
                       int64_t count, Stream stream) override;
  absl::Status FromFloat(void* dst, DType dst_dtype, const float* src,
                         int64_t count, Stream stream) override;
  absl::Status Scale(float* data, int64_t count, float factor,
                     Stream stream) override;
  absl::Status ApplyScaled(void* param, DType param_dtype, const void* update,
                           DType update_dtype, int64_t count, float decay,
                           float step, Stream stream) override;
  absl::Status PrepareFiniteChecks(int64_t count, Stream stream) override;
  absl::Status CheckFinite(absl::Span<const FloatSpan> spans, int64_t first,
                           Stream stream) override;
  absl::StatusOr<std::vector<int64_t>> FiniteResults(int64_t count,
                                                     Stream stream) override;
  absl::Status Synchronize(Stream stream) override;

 private:
  CudaDeviceOps(int device, cudaStream_t stream, bool owns_stream)
      : device_(device), stream_(stream), owns_stream_(owns_stream) {}
  absl::Status Init();
  absl::Status UseDevice() const;

  const int device_;
  cudaStream_t stream_;
  const bool owns_stream_;
  cudaStream_t compute_stream_ = nullptr;  // owned, non-blocking
  // Mark events (timed), reused step after step: the first marks_used_
  // hold this step's marks.
  std::vector<cudaEvent_t> marks_;
  size_t marks_used_ = 0;
  DeviceBuffer flags_;  // one unsigned long long per span, grown on demand
  int64_t finite_count_ = 0;  // spans PrepareFiniteChecks made room for
  unsigned long long* host_flags_ = nullptr;  // pinned, same size
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_CUDA_DEVICE_OPS_H_
