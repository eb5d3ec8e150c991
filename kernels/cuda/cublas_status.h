// Conversions from CUDA runtime and cuBLAS error codes to absl::Status, so
// the CUDA backend reports every failure as a status naming the call.
// Thread-safe.
#ifndef MUONPS_KERNELS_CUDA_CUDA_STATUS_H_
#define MUONPS_KERNELS_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace cuda {

// OK for cudaSuccess; otherwise "<what>: <CUDA error name>: <description>",
// RESOURCE_EXHAUSTED for out-of-memory, UNAVAILABLE when no usable device
// or driver exists, INTERNAL for the rest.
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

// OK for CUBLAS_STATUS_SUCCESS; otherwise INTERNAL (RESOURCE_EXHAUSTED for
// allocation failures) naming `what` and the cuBLAS status.
absl::Status CublasStatus(cublasStatus_t status, absl::string_view what);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

// Returns from the enclosing function if the CUDA call `expr` fails.
#define MUONPS_CUDA_RETURN_IF_ERROR(expr) \
  MUONPS_RETURN_IF_ERROR(::muonps::kernels::cuda::CudaStatus((expr), #expr))

// Returns from the enclosing function if the cuBLAS call `expr` fails.
#define MUONPS_CUBLAS_RETURN_IF_ERROR(expr) \
  MUONPS_RETURN_IF_ERROR(::muonps::kernels::cuda::CublasStatus((expr), #expr))

#endif  // MUONPS_KERNELS_CUDA_CUDA_STATUS_H_
