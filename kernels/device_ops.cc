#include "kernels/device_ops.h"

#include "absl/strings/str_cat.h"

namespace muonps {
namespace kernels {

absl::Status CheckLentDType(DType dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kBFloat16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: ", DTypeName(dtype),
                   " is not supported; lend fp32 or bf16 tensors"));
}

}  // namespace kernels
}  // namespace muonps
