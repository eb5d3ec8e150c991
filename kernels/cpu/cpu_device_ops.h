// DeviceOps on host memory: plain loops, kHostStream only, every call done
// when it returns. The step arithmetic the CPU workers have always used
// (fp32, operation for operation as kernels/cuda/elementwise.cu).
#ifndef MUONPS_KERNELS_CPU_CPU_DEVICE_OPS_H_
#define MUONPS_KERNELS_CPU_CPU_DEVICE_OPS_H_

#include "kernels/device_ops.h"

namespace muonps {
namespace kernels {

class CpuDeviceOps final : public DeviceOps {
 public:
  Device device() const override { return kHostDevice; }
  Stream stream() const override { return kHostStream; }
  absl::StatusOr<std::unique_ptr<FloatBuffer>> Allocate(
      int64_t count, const char* what) override;
  absl::Status Copy(float* dst, const float* src, int64_t count,
                    Stream stream) override;
  absl::Status Scale(float* data, int64_t count, float factor,
                     Stream stream) override;
  absl::Status ApplyScaled(float* param, const float* update, int64_t count,
                           float decay, float step, Stream stream) override;
  absl::StatusOr<std::vector<int64_t>> FirstNonFinite(
      absl::Span<const FloatSpan> spans, Stream stream) override;
  absl::Status Synchronize(Stream stream) override;
};

}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CPU_CPU_DEVICE_OPS_H_
