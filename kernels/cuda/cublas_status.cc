#include "kernels/cuda/cublas_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace kernels {
namespace cuda {

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case CUBLAS_STATUS_INVALID_VALUE:
      code = absl::StatusCode::kInvalidArgument;
      break;
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      code = absl::StatusCode::kFailedPrecondition;
      break;
    default:
      break;
  }
  return absl::Status(
      code, absl::StrCat(what, ": ", cublasGetStatusName(status), ": ",
                         cublasGetStatusString(status)));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
