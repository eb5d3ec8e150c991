// The CUDA backend's MeasurementDevice: memory from cudaMalloc on one GPU,
// host-to-device copies with cudaMemcpy, and a device-wide synchronize (so
// that work the kernels queue on any of their streams is waited for).
//
// Not safe for concurrent use. Creating one on a machine without a GPU fails
// cleanly with FAILED_PRECONDITION; nothing here needs a GPU to link.
#ifndef MUONPS_TOOLS_AUTOTUNE_CUDA_MEASUREMENT_DEVICE_H_
#define MUONPS_TOOLS_AUTOTUNE_CUDA_MEASUREMENT_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tools/autotune/measurement_device.h"

namespace muonps {
namespace autotune {

class CudaMeasurementDevice final : public MeasurementDevice {
 public:
  // Selects GPU `device` for the calling thread and reads its name.
  // FAILED_PRECONDITION naming `device` if there is no such GPU (or none).
  static absl::StatusOr<std::unique_ptr<CudaMeasurementDevice>> Create(
      int device);

  std::string name() const override { return name_; }
  // RESOURCE_EXHAUSTED naming the size and the free memory when cudaMalloc
  // fails.
  absl::StatusOr<float*> Allocate(int64_t count) override;
  void Free(float* data) override;
  absl::Status CopyFromHost(absl::Span<const float> host,
                            float* device) override;
  // cudaDeviceSynchronize; INTERNAL with the CUDA error name otherwise.
  absl::Status Synchronize() override;

 private:
  CudaMeasurementDevice(int device, std::string name)
      : device_(device), name_(std::move(name)) {}

  int device_;
  std::string name_;
};

}  // namespace autotune
}  // namespace muonps

#endif  // MUONPS_TOOLS_AUTOTUNE_CUDA_MEASUREMENT_DEVICE_H_
