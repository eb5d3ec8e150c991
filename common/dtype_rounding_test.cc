// The bf16 and fp16 scalar conversions of dtype.h: every pattern round
// trips through float and fp16 decodes to its IEEE value; rounding to
// nearest even at ties, subnormals, overflow to Inf, signed zero and NaN;
// and a million random floats each against a reference that shares nothing
// with the implementation.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/float_bits_test_util.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

using dtype_test::Bits;
using dtype_test::FromBits;

// The value of a finite fp16 pattern's magnitude, from the IEEE 754 binary16
// definition (5 exponent bits, bias 15, 10 mantissa bits). Exact in double.
// Pattern 0x7c00 (Inf) is given the value 2^16 that an unbounded exponent
// would give it: IEEE rounds to Inf exactly when the value rounds to 2^16.
double HalfMagnitude(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return std::ldexp(mantissa, -24);
  return std::ldexp(1024 + mantissa, exponent - 25);
}

// The same for bf16 (8 exponent bits, bias 127, 7 mantissa bits); 0x7f80
// (Inf) gets the value 2^128.
double BFloat16Magnitude(uint16_t bits) {
  const int exponent = (bits >> 7) & 0xff;
  const int mantissa = bits & 0x7f;
  if (exponent == 0) return std::ldexp(mantissa, -133);
  return std::ldexp(128 + mantissa, exponent - 134);
}

// Picks between two adjacent magnitudes `lo_bits` < `hi_bits` (as patterns of
// the same format) the one nearest `x`, ties to the even pattern. Both
// differences are exact in double: lo <= x <= hi <= 2 * lo (Sterbenz), or lo
// is 0 and x - 0 is exact.
uint16_t Nearest(double x, uint16_t lo_bits, double lo, uint16_t hi_bits,
                 double hi) {
  const double below = x - lo;
  const double above = hi - x;
  if (below < above) return lo_bits;
  if (above < below) return hi_bits;
  return (lo_bits & 1u) == 0 ? lo_bits : hi_bits;
}

// Round-to-nearest-even fp16 of a non-NaN float, by searching the table of
// every fp16 magnitude; shares nothing with the implementation under test.
class HalfReference {
 public:
  HalfReference() {
    for (uint32_t bits = 0; bits <= 0x7c00u; ++bits) {
      magnitudes_.push_back(HalfMagnitude(static_cast<uint16_t>(bits)));
    }
  }

  uint16_t Round(float value) const {
    const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
    const double x = std::fabs(static_cast<double>(value));
    if (x >= magnitudes_.back()) return sign | 0x7c00u;
    // The largest magnitude <= x; x < 2^16 so its successor exists.
    const auto it =
        std::upper_bound(magnitudes_.begin(), magnitudes_.end(), x) - 1;
    const auto lo_bits = static_cast<uint16_t>(it - magnitudes_.begin());
    const auto hi_bits = static_cast<uint16_t>(lo_bits + 1);
    return sign | Nearest(x, lo_bits, magnitudes_[lo_bits], hi_bits,
                          magnitudes_[hi_bits]);
  }

 private:
  std::vector<double> magnitudes_;
};

// Round-to-nearest-even bf16 of a non-NaN float: the two candidates are the
// float truncated to 16 bits and the next bf16 pattern up in magnitude.
uint16_t BFloat16Reference(float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  const double x = std::fabs(static_cast<double>(value));
  if (std::isinf(value)) return sign | 0x7f80u;
  const auto lo_bits = static_cast<uint16_t>((Bits(value) & 0x7fffffffu) >> 16);
  const auto hi_bits = static_cast<uint16_t>(lo_bits + 1);
  return sign | Nearest(x, lo_bits, BFloat16Magnitude(lo_bits), hi_bits,
                        BFloat16Magnitude(hi_bits));
}

TEST(BFloat16Test, EveryPatternRoundTripsThroughFloat) {
  int mismatches = 0;
  uint32_t first_mismatch = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto pattern = static_cast<uint16_t>(bits);
    const float value = BFloat16ToFloat(pattern);
    const uint16_t back = FloatToBFloat16(value);
    const bool is_nan = (bits & 0x7f80u) == 0x7f80u && (bits & 0x7fu) != 0;
    const bool ok = is_nan
                        ? std::isnan(value) && std::isnan(BFloat16ToFloat(back))
                        : back == pattern;
    if (!ok && mismatches++ == 0) first_mismatch = bits;
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch: 0x" << std::hex
                           << first_mismatch;
}

TEST(HalfTest, EveryPatternRoundTripsThroughFloat) {
  int mismatches = 0;
  uint32_t first_mismatch = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const auto pattern = static_cast<uint16_t>(bits);
    const float value = HalfToFloat(pattern);
    const uint16_t back = FloatToHalf(value);
    const bool is_nan = (bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0;
    const bool ok = is_nan ? std::isnan(value) && std::isnan(HalfToFloat(back))
                           : back == pattern;
    if (!ok && mismatches++ == 0) first_mismatch = bits;
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch: 0x" << std::hex
                           << first_mismatch;
}

TEST(HalfTest, EveryFinitePatternDecodesToItsIeeeValue) {
  int mismatches = 0;
  uint32_t first_mismatch = 0;
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    if ((bits & 0x7c00u) == 0x7c00u) continue;  // Inf and NaN
    const auto pattern = static_cast<uint16_t>(bits);
    const double magnitude = HalfMagnitude(pattern & 0x7fffu);
    const double expected = (bits & 0x8000u) ? -magnitude : magnitude;
    const float value = HalfToFloat(pattern);
    const bool ok = static_cast<double>(value) == expected &&
                    std::signbit(value) == ((bits & 0x8000u) != 0);
    if (!ok && mismatches++ == 0) first_mismatch = bits;
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch: 0x" << std::hex
                           << first_mismatch;
  EXPECT_EQ(HalfToFloat(0x7c00u), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00u), -std::numeric_limits<float>::infinity());
}

TEST(BFloat16Test, ExactTiesRoundToEvenMantissa) {
  // 1 + 2^-8 lies halfway between bf16 0x3f80 (even) and 0x3f81.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808000u)), 0x3f80u);
  // 1 + 3 * 2^-8 lies halfway between 0x3f81 (odd) and 0x3f82.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f818000u)), 0x3f82u);
  EXPECT_EQ(FloatToBFloat16(FromBits(0xbf808000u)), 0xbf80u);
  EXPECT_EQ(FloatToBFloat16(FromBits(0xbf818000u)), 0xbf82u);
  // One float ulp either side of a tie goes to the nearer neighbour.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f808001u)), 0x3f81u);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3f817fffu)), 0x3f81u);
  // A tie whose round-up carries into the exponent: 2 - 2^-8 -> 2.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x3fff8000u)), 0x4000u);
}

TEST(BFloat16Test, LargestFloatsOverflowToInf) {
  EXPECT_EQ(FloatToBFloat16(FLT_MAX), 0x7f80u);
  EXPECT_EQ(FloatToBFloat16(-FLT_MAX), 0xff80u);
  // Just below the tie with Inf stays at the largest finite bf16.
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7f7f7fffu)), 0x7f7fu);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7f80u);
  EXPECT_EQ(FloatToBFloat16(-std::numeric_limits<float>::infinity()), 0xff80u);
}

TEST(BFloat16Test, SignedZeroAndNanArePreserved) {
  EXPECT_EQ(FloatToBFloat16(0.0f), 0x0000u);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000u);
  EXPECT_TRUE(std::signbit(BFloat16ToFloat(0x8000u)));
  EXPECT_EQ(BFloat16ToFloat(0x8000u), 0.0f);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(
      FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(
      FloatToBFloat16(-std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lives only in the low 16 bits must not truncate to
  // Inf.
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(FromBits(0x7f800001u)))));
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(FromBits(0xff800001u)))));
  // The largest NaN payload must not carry into the sign bit.
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(FromBits(0x7fffffffu)))));
}

TEST(BFloat16Test, MillionRandomFloatsRoundToNearestEven) {
  std::mt19937 rng(20240601);
  std::uniform_int_distribution<uint32_t> any_bits;
  int checked = 0;
  int mismatches = 0;
  uint32_t first_mismatch = 0;
  while (checked < 1000000) {
    uint32_t bits = any_bits(rng);
    // One in four lands exactly on a tie between two bf16 values.
    if ((bits & 3u) == 0) bits = (bits & 0xffff0000u) | 0x8000u;
    const float value = FromBits(bits);
    if (std::isnan(value)) continue;
    ++checked;
    if (FloatToBFloat16(value) != BFloat16Reference(value) &&
        mismatches++ == 0) {
      first_mismatch = bits;
    }
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch: float bits 0x" << std::hex
                           << first_mismatch;
}

TEST(HalfTest, ExactTiesRoundToEvenMantissa) {
  // 1 + 2^-11 lies halfway between fp16 0x3c00 (even) and 0x3c01.
  EXPECT_EQ(FloatToHalf(FromBits(0x3f801000u)), 0x3c00u);
  // 1 + 3 * 2^-11 lies halfway between 0x3c01 (odd) and 0x3c02.
  EXPECT_EQ(FloatToHalf(FromBits(0x3f803000u)), 0x3c02u);
  EXPECT_EQ(FloatToHalf(FromBits(0xbf801000u)), 0xbc00u);
  EXPECT_EQ(FloatToHalf(FromBits(0xbf803000u)), 0xbc02u);
  EXPECT_EQ(FloatToHalf(FromBits(0x3f801001u)), 0x3c01u);
  EXPECT_EQ(FloatToHalf(FromBits(0x3f802fffu)), 0x3c01u);
  // 2 - 2^-11 ties between 0x3bff (odd) and 2.0 (0x4000): carries.
  EXPECT_EQ(FloatToHalf(2.0f - std::ldexp(1.0f, -11)), 0x4000u);
}

TEST(HalfTest, EveryTieBetweenNeighboursRoundsToEvenAndNeighboursOfTiesDoNot) {
  // Walks every pair of adjacent non-negative fp16 values, Inf (as 2^16)
  // included, and checks the midpoint and the floats just either side of it.
  int mismatches = 0;
  uint32_t first_mismatch = 0;
  for (uint32_t lo = 0; lo < 0x7c00u; ++lo) {
    const uint32_t hi = lo + 1;
    const double mid = (HalfMagnitude(static_cast<uint16_t>(lo)) +
                        HalfMagnitude(static_cast<uint16_t>(hi))) /
                       2;
    const auto tie = static_cast<float>(mid);  // 12 significant bits: exact
    const uint32_t even = (lo & 1u) == 0 ? lo : hi;
    const float below = std::nextafter(tie, 0.0f);
    const float above = std::nextafter(tie, 1e9f);
    const bool ok = static_cast<double>(tie) == mid &&
                    FloatToHalf(tie) == even &&
                    FloatToHalf(-tie) == (even | 0x8000u) &&
                    FloatToHalf(below) == lo && FloatToHalf(above) == hi;
    if (!ok && mismatches++ == 0) first_mismatch = lo;
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch at lower neighbour 0x" << std::hex
                           << first_mismatch;
}

TEST(HalfTest, ValuesAtOrAbove65520OverflowToInf) {
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bffu);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bffu);
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bffu);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00u);
  EXPECT_EQ(FloatToHalf(-65520.0f), 0xfc00u);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00u);
  EXPECT_EQ(FloatToHalf(FLT_MAX), 0x7c00u);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00u);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00u);
  EXPECT_EQ(HalfToFloat(FloatToHalf(65519.0f)), 65504.0f);
}

TEST(HalfTest, SubnormalsRoundToNearestEven) {
  const float smallest = std::ldexp(1.0f, -24);  // fp16 0x0001
  EXPECT_EQ(FloatToHalf(smallest), 0x0001u);
  EXPECT_EQ(HalfToFloat(0x0001u), smallest);
  // 2^-25 ties between 0 (even) and 2^-24.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000u);
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -25)), 0x8000u);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001u);
  EXPECT_EQ(FloatToHalf(std::nextafter(std::ldexp(1.0f, -25), 0.0f)), 0x0000u);
  // 3 * 2^-25 ties between 0x0001 (odd) and 0x0002.
  EXPECT_EQ(FloatToHalf(3 * std::ldexp(1.0f, -25)), 0x0002u);
  // Far below the smallest subnormal, including float subnormals.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -30)), 0x0000u);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000u);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::denorm_min()), 0x8000u);
  // The largest subnormal plus half an ulp ties up into the smallest normal.
  EXPECT_EQ(FloatToHalf(1023.5f * smallest), 0x0400u);
  EXPECT_EQ(FloatToHalf(1023.0f * smallest), 0x03ffu);
  EXPECT_EQ(FloatToHalf(-1023.0f * smallest), 0x83ffu);
}

TEST(HalfTest, SignedZeroAndNanArePreserved) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000u);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000u);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000u)));
  EXPECT_EQ(HalfToFloat(0x8000u), 0.0f);
  for (const uint32_t nan_bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u,
                                  0xff800001u, 0x7fffffffu, 0x7f802000u}) {
    const uint16_t half = FloatToHalf(FromBits(nan_bits));
    EXPECT_TRUE(std::isnan(HalfToFloat(half)))
        << "float bits 0x" << std::hex << nan_bits << " gave half 0x" << half;
  }
}

TEST(HalfTest, MillionRandomFloatsInHalfRangeRoundToNearestEven) {
  const HalfReference reference;
  std::mt19937 rng(7);
  // Unbiased exponents from -27 (below half the smallest subnormal) to 16
  // (past the overflow threshold); any mantissa; either sign.
  std::uniform_int_distribution<uint32_t> exponent(127 - 27, 127 + 16);
  std::uniform_int_distribution<uint32_t> mantissa(0, 0x7fffffu);
  std::uniform_int_distribution<uint32_t> sign(0, 1);
  int mismatches = 0;
  uint32_t first_mismatch = 0;
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t bits =
        (sign(rng) << 31) | (exponent(rng) << 23) | mantissa(rng);
    const float value = FromBits(bits);
    if (FloatToHalf(value) != reference.Round(value) && mismatches++ == 0) {
      first_mismatch = bits;
    }
  }
  EXPECT_EQ(mismatches, 0) << "first mismatch: float bits 0x" << std::hex
                           << first_mismatch;
}

}  // namespace
}  // namespace muonps
