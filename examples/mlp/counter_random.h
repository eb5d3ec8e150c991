// Counter-based random numbers for the MLP example: every value is a pure
// function of (seed, stream, index), so any process can produce any slice of
// a weight matrix or a data batch without producing what comes before it,
// and the numbers do not depend on the standard library (std::*_distribution
// differ between libstdc++ and libc++). All functions are thread-safe.
#ifndef MUONPS_EXAMPLES_MLP_COUNTER_RANDOM_H_
#define MUONPS_EXAMPLES_MLP_COUNTER_RANDOM_H_

#include <cmath>
#include <cstdint>

namespace muonps {
namespace mlp_random {

// SplitMix64's output function: a bijection on 64 bits with full avalanche.
inline uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// 64 random bits for element `index` of stream `stream` under `seed`.
inline uint64_t Bits(uint64_t seed, uint64_t stream, uint64_t index) {
  return Mix64(Mix64(Mix64(seed) ^ stream) ^ index);
}

// Uniform in [-1, 1), a multiple of 2^-23 (exact in fp32).
inline float UniformSymmetric(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t top24 = Bits(seed, stream, index) >> 40;
  return static_cast<float>(static_cast<int64_t>(top24) - (1 << 23)) *
         (1.0f / (1 << 23));
}

// Standard normal by Box-Muller over the two 32-bit halves of one draw.
inline float Normal(uint64_t seed, uint64_t stream, uint64_t index) {
  constexpr double kTwoPi = 6.283185307179586;
  const uint64_t bits = Bits(seed, stream, index);
  // u1 in (0, 1] so the logarithm is finite; u2 in [0, 1).
  const double u1 = (static_cast<double>(bits >> 32) + 1.0) * 0x1p-32;
  const double u2 = static_cast<double>(bits & 0xffffffffu) * 0x1p-32;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                            std::cos(kTwoPi * u2));
}

}  // namespace mlp_random
}  // namespace muonps

#endif  // MUONPS_EXAMPLES_MLP_COUNTER_RANDOM_H_
