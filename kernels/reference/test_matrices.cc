#include "kernels/reference/test_matrices.h"

#include <cmath>
#include <random>

namespace muonps {
namespace kernels {
namespace reference {
namespace {

// n x k matrix (column j is vector j) with orthonormal columns, by modified
// Gram-Schmidt twice over Gaussian columns.
std::vector<double> OrthonormalColumns(int64_t n, int64_t k,
                                       std::mt19937* rng) {
  std::normal_distribution<double> normal;
  std::vector<double> q(n * k);
  for (double& v : q) v = normal(*rng);
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t j = 0; j < k; ++j) {
      for (int64_t p = 0; p < j; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i) dot += q[i * k + j] * q[i * k + p];
        for (int64_t i = 0; i < n; ++i) q[i * k + j] -= dot * q[i * k + p];
      }
      double norm = 0;
      for (int64_t i = 0; i < n; ++i) norm += q[i * k + j] * q[i * k + j];
      norm = std::sqrt(norm);
      for (int64_t i = 0; i < n; ++i) q[i * k + j] /= norm;
    }
  }
  return q;
}

}  // namespace

std::vector<float> GaussianMatrix(int64_t rows, int64_t cols, uint32_t seed,
                                  float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> out(rows * cols);
  for (float& v : out) v = normal(rng);
  return out;
}

std::vector<float> MatrixWithSpectrum(
    int64_t rows, int64_t cols, const std::vector<double>& singular_values,
    uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t k = static_cast<int64_t>(singular_values.size());
  const std::vector<double> u = OrthonormalColumns(rows, k, &rng);
  const std::vector<double> v = OrthonormalColumns(cols, k, &rng);
  std::vector<float> out(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        sum += u[i * k + p] * singular_values[p] * v[j * k + p];
      }
      out[i * cols + j] = static_cast<float>(sum);
    }
  }
  return out;
}

std::vector<double> GeometricSpectrum(int count, double largest,
                                      double smallest) {
  std::vector<double> values(count);
  for (int i = 0; i < count; ++i) {
    const double t = count == 1 ? 0.0 : static_cast<double>(i) / (count - 1);
    values[i] = largest * std::pow(smallest / largest, t);
  }
  return values;
}

}  // namespace reference
}  // namespace kernels
}  // namespace muonps
