// Deterministic test inputs for the kernels: Gaussian matrices and matrices
// with a chosen singular spectrum (ill-conditioned, rank-deficient).
// Test use only; pure functions of their seed.
#ifndef MUONPS_KERNELS_REFERENCE_TEST_MATRICES_H_
#define MUONPS_KERNELS_REFERENCE_TEST_MATRICES_H_

#include <cstdint>
#include <vector>

namespace muonps {
namespace kernels {
namespace reference {

// rows x cols i.i.d. N(0, scale^2) entries.
std::vector<float> GaussianMatrix(int64_t rows, int64_t cols, uint32_t seed,
                                  float scale = 1.0f);

// U diag(singular_values) V^T with random orthonormal U (rows x k) and
// V (cols x k), k = singular_values.size() <= min(rows, cols).
std::vector<float> MatrixWithSpectrum(
    int64_t rows, int64_t cols, const std::vector<double>& singular_values,
    uint32_t seed);

// `count` values spaced geometrically from `largest` down to `smallest`.
std::vector<double> GeometricSpectrum(int count, double largest,
                                      double smallest);

}  // namespace reference
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_REFERENCE_TEST_MATRICES_H_
