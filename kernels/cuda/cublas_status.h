// CublasStatus: cuBLAS and cuBLASLt status codes as absl::Status, so the
// CUDA backend reports every failed GEMM call as a status naming the call.
// CUDA runtime errors go through common/cuda_status.h. Thread-safe: a pure
// function.
#ifndef MUONPS_KERNELS_CUDA_CUBLAS_STATUS_H_
#define MUONPS_KERNELS_CUDA_CUBLAS_STATUS_H_

#include <cublas_v2.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace cuda {

// OK for CUBLAS_STATUS_SUCCESS. Otherwise "<what>: <cuBLAS status name>:
// <description>" with the codes of common/cuda_status.h's mapping:
// RESOURCE_EXHAUSTED for an allocation failure, INVALID_ARGUMENT for an
// invalid value, FAILED_PRECONDITION for an unsupported architecture or
// operation or an uninitialized handle, INTERNAL for the rest (execution
// and mapping failures, internal errors).
absl::Status CublasStatus(cublasStatus_t status, absl::string_view what);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

// Returns from the enclosing function if the cuBLAS call `expr` fails.
#define MUONPS_CUBLAS_RETURN_IF_ERROR(expr) \
  MUONPS_RETURN_IF_ERROR(::muonps::kernels::cuda::CublasStatus((expr), #expr))

#endif  // MUONPS_KERNELS_CUDA_CUBLAS_STATUS_H_
