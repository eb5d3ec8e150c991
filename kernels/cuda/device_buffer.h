// An owned block of GPU memory (cudaMalloc / cudaFree), movable, not
// copyable. Allocation reports failure as a status instead of throwing.
// Thread-compatible.
#ifndef MUONPS_KERNELS_CUDA_DEVICE_BUFFER_H_
#define MUONPS_KERNELS_CUDA_DEVICE_BUFFER_H_

#include <cstddef>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonps {
namespace kernels {
namespace cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  ~DeviceBuffer();

  // `bytes` of device memory on the current device, zeroed (so nothing
  // ever reads uninitialized memory); RESOURCE_EXHAUSTED naming `what` when
  // the device is full.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes,
                                               absl::string_view what);

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Release();

  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_DEVICE_BUFFER_H_
