#include "kernels/cuda/precision.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace cuda {

absl::StatusOr<Precision> ParsePrecision(absl::string_view name) {
  if (name == "fp32") return Precision::kFp32;
  if (name == "bf16") return Precision::kBf16;
  if (name == "fp16") return Precision::kFp16;
  return InvalidField(
      "precision",
      absl::StrCat(Quoted(name), " is not one of fp32, bf16, fp16"));
}

absl::string_view PrecisionName(Precision precision) {
  return DTypeName(PrecisionDType(precision));
}

DType PrecisionDType(Precision precision) {
  switch (precision) {
    case Precision::kBf16:
      return DType::kBFloat16;
    case Precision::kFp16:
      return DType::kFloat16;
    case Precision::kFp32:
      break;
  }
  return DType::kFloat32;
}

cudaDataType CudaDataType(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kFloat32:
      break;
  }
  return CUDA_R_32F;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
