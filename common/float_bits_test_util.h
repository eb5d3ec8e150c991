// Bits and FromBits: a float's bit pattern and back, for the dtype tests.
// Tests only (testonly in BUILD).
#ifndef MUONPS_COMMON_FLOAT_BITS_TEST_UTIL_H_
#define MUONPS_COMMON_FLOAT_BITS_TEST_UTIL_H_

#include <cstdint>
#include <cstring>

namespace muonps {
namespace dtype_test {

inline uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace dtype_test
}  // namespace muonps

#endif  // MUONPS_COMMON_FLOAT_BITS_TEST_UTIL_H_
