#include "kernels/cuda/device_buffer.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"

namespace muonps {
namespace kernels {
namespace cuda {

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

void DeviceBuffer::Release() {
  if (data_ != nullptr) cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes,
                                                    absl::string_view what) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaMalloc(&buffer.data_, bytes),
      absl::StrCat("allocating ", bytes, " bytes of GPU memory for ", what)));
  buffer.bytes_ = bytes;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaMemset(buffer.data_, 0, bytes),
                 absl::StrCat("zeroing the GPU memory for ", what)));
  // The memset ran on the legacy stream, which non-blocking streams do not
  // wait for: finish it before anyone else touches the memory.
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaStreamSynchronize(nullptr),
                 absl::StrCat("zeroing the GPU memory for ", what)));
  return buffer;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
