// Element types muonps moves and computes with, and exact conversions
// between them.
//
// bf16 and fp16 values are stored as raw uint16_t bit patterns. Conversions
// from float round to nearest, ties to even, as CUDA's __float2bfloat16 and
// __float2half do; NaN stays NaN and overflow becomes Inf. All functions are
// pure and thread-safe.
#ifndef MUONPS_COMMON_DTYPE_H_
#define MUONPS_COMMON_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonps {

enum class DType {
  kFloat32,
  kBFloat16,
  kFloat16,
};

// Bytes per element: 4 for kFloat32, 2 otherwise.
size_t DTypeSize(DType dtype);

// "fp32", "bf16" or "fp16".
absl::string_view DTypeName(DType dtype);

// Parses a name DTypeName produces (also "float32", "bfloat16", "float16").
// Returns INVALID_ARGUMENT naming `dtype` for anything else.
absl::StatusOr<DType> ParseDType(absl::string_view name);

uint16_t FloatToBFloat16(float value);
float BFloat16ToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);

// Converts `count` elements of type `dtype` at `src` to float at `dst`.
void ToFloat(DType dtype, const void* src, size_t count, float* dst);

// Converts `count` floats at `src` to `dtype` at `dst` (rounding as above).
void FromFloat(DType dtype, const float* src, size_t count, void* dst);

}  // namespace muonps

#endif  // MUONPS_COMMON_DTYPE_H_
