// The human-readable name of a CUDA device ("NVIDIA H200"), as tools and
// benchmarks print it beside their measurements. Thread-safe; needs no GPU
// to link, and fails cleanly (never crashes) on a machine without one.
#ifndef MUONPS_KERNELS_CUDA_DEVICE_NAME_H_
#define MUONPS_KERNELS_CUDA_DEVICE_NAME_H_

#include <string>

#include "absl/status/statusor.h"

namespace muonps {
namespace kernels {
namespace cuda {

// cudaGetDeviceProperties(device).name. INVALID_ARGUMENT naming `device`
// for a negative ordinal; otherwise the CUDA error as a status naming the
// device (UNAVAILABLE where no usable GPU or driver exists).
absl::StatusOr<std::string> CudaDeviceName(int device);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_DEVICE_NAME_H_
