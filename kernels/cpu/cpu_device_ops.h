// DeviceOps on host memory: plain loops, kHostStream only, every call done
// when it returns. The step arithmetic the CPU workers have always used
// (fp32, operation for operation as kernels/cuda/elementwise.cu).
#ifndef MUONPS_KERNELS_CPU_CPU_DEVICE_OPS_H_
#define MUONPS_KERNELS_CPU_CPU_DEVICE_OPS_H_

#include <chrono>
#include <vector>

#include "kernels/device_ops.h"

namespace muonps {
namespace kernels {

class CpuDeviceOps final : public DeviceOps {
 public:
  Device device() const override { return kHostDevice; }
  Stream stream() const override { return kHostStream; }
  Stream compute_stream() const override { return kHostStream; }
  absl::StatusOr<int> Mark(Stream stream) override;
  absl::Status WaitForMark(Stream waiter, int mark) override;
  absl::StatusOr<std::vector<double>> MarkTimesMs() override;
  void ClearMarks() override { marks_.clear(); }
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
  std::vector<std::chrono::steady_clock::time_point> marks_;
  std::vector<int64_t> finite_;  // by span number: the check's result
};

}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CPU_CPU_DEVICE_OPS_H_
