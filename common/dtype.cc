#include "common/dtype.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace {

uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

size_t DTypeSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "fp32" || name == "float32") return DType::kFloat32;
  if (name == "bf16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "fp16" || name == "float16") return DType::kFloat16;
  return InvalidField(
      "dtype", absl::StrCat(Quoted(name), " is not one of fp32, bf16, fp16"));
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep the sign, force a quiet-NaN mantissa bit.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest even on the 16 dropped bits; carries into the exponent
  // turn the largest finite values into Inf, as they should.
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float BFloat16ToFloat(uint16_t bits) {
  return BitsToFloat(static_cast<uint32_t>(bits) << 16);
}

uint16_t FloatToHalf(float value) {
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520
  const int32_t exponent = static_cast<int32_t>(abs_bits >> 23) - 127;
  uint32_t mantissa = (abs_bits & 0x7fffffu) | 0x800000u;
  if (exponent < -25) return sign;  // below half the smallest subnormal
  // Number of low bits of the 24-bit mantissa dropped: 13 for normal halfs,
  // more for subnormals (exponent < -14).
  const int32_t shift = exponent < -14 ? 13 + (-14 - exponent) : 13;
  const uint32_t dropped = mantissa & ((1u << shift) - 1u);
  const uint32_t half_way = 1u << (shift - 1);
  mantissa >>= shift;
  if (dropped > half_way || (dropped == half_way && (mantissa & 1u))) {
    ++mantissa;
  }
  if (exponent < -14) return sign | static_cast<uint16_t>(mantissa);
  // Normal: mantissa holds the implicit bit at 1 << 10; adding the biased
  // exponent lets a rounding carry propagate into it.
  const uint32_t half = (static_cast<uint32_t>(exponent + 14) << 10) + mantissa;
  return sign | static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1fu) {
    return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {
    return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) return BitsToFloat(sign);
  // Subnormal half: value = mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}

void ToFloat(DType dtype, const void* src, size_t count, float* dst) {
  if (count == 0) return;  // empty tensors may have null data
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBFloat16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = BFloat16ToFloat(in[i]);
      return;
    }
    case DType::kFloat16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < count; ++i) dst[i] = HalfToFloat(in[i]);
      return;
    }
  }
}

void FromFloat(DType dtype, const float* src, size_t count, void* dst) {
  if (count == 0) return;  // empty tensors may have null data
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kBFloat16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = FloatToBFloat16(src[i]);
      return;
    }
    case DType::kFloat16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < count; ++i) out[i] = FloatToHalf(src[i]);
      return;
    }
  }
}

}  // namespace muonps
