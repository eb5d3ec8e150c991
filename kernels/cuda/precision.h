// The input precision of the Newton-Schulz GEMMs on the GPU. Accumulation is
// always fp32; fp32 inputs run plain fp32 GEMMs (no TF32). Plain values;
// thread-safe.
#ifndef MUONPS_KERNELS_CUDA_PRECISION_H_
#define MUONPS_KERNELS_CUDA_PRECISION_H_

#include <library_types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace muonps {
namespace kernels {
namespace cuda {

enum class Precision { kFp32, kBf16, kFp16 };

// Parses "fp32", "bf16" or "fp16"; INVALID_ARGUMENT naming `precision`
// otherwise.
absl::StatusOr<Precision> ParsePrecision(absl::string_view name);

// "fp32", "bf16" or "fp16".
absl::string_view PrecisionName(Precision precision);

// The GEMM inputs' element type, which is also what an update is rounded
// to (MuonKernels::update_dtype).
DType PrecisionDType(Precision precision);

// The CUDA library type of `dtype`'s elements.
cudaDataType CudaDataType(DType dtype);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_PRECISION_H_
