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
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
  }
  return "unknown";
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
