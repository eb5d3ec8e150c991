#include "kernels/reference/reference_muon.h"

#include <algorithm>
#include <cmath>

namespace muonps {
namespace kernels {
namespace reference {

Matrix MatMul(const Matrix& a, const Matrix& b, int64_t m, int64_t k,
              int64_t n) {
  Matrix c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double aip = a[i * k + p];
      for (int64_t j = 0; j < n; ++j) c[i * n + j] += aip * b[p * n + j];
    }
  }
  return c;
}

Matrix Transpose(const Matrix& a, int64_t rows, int64_t cols) {
  Matrix t(rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = a[i * cols + j];
  }
  return t;
}

Matrix NewtonSchulz(const Matrix& in, int64_t rows, int64_t cols,
                    const NewtonSchulzOptions& options) {
  const bool tall = rows > cols;
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  Matrix x = tall ? Transpose(in, rows, cols) : in;
  double norm = 0;
  for (double v : x) norm += v * v;
  const double denom =
      std::max(NormalizationMargin(options) * std::sqrt(norm), options.eps);
  for (double& v : x) v /= denom;
  if (options.aol) {
    const Matrix a = MatMul(x, Transpose(x, m, n), m, n, m);
    for (int64_t i = 0; i < m; ++i) {
      double sum = 0;
      for (int64_t j = 0; j < m; ++j) sum += std::fabs(a[i * m + j]);
      if (!(sum > 0)) continue;
      const double s = 1.0 / (NormalizationMargin(options) * std::sqrt(sum));
      for (int64_t j = 0; j < n; ++j) x[i * n + j] *= s;
    }
  }
  for (int step = 0; step < options.steps; ++step) {
    const NsCoefficients k = CoefficientsForStep(options, step);
    const Matrix a = MatMul(x, Transpose(x, m, n), m, n, m);
    const Matrix a2 = MatMul(a, a, m, m, m);
    Matrix b(m * m);
    for (int64_t i = 0; i < m * m; ++i) b[i] = k.b * a[i] + k.c * a2[i];
    const Matrix bx = MatMul(b, x, m, m, n);
    for (int64_t i = 0; i < m * n; ++i) x[i] = k.a * x[i] + bx[i];
  }
  return tall ? Transpose(x, m, n) : x;
}

Matrix PolarFactor(const Matrix& in, int64_t rows, int64_t cols,
                   int iterations) {
  const bool tall = rows > cols;
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  Matrix x = tall ? Transpose(in, rows, cols) : in;
  double norm = 0;
  for (double v : x) norm += v * v;
  for (double& v : x) v /= std::sqrt(norm);
  // The cubic x <- 1.5 x - 0.5 x x^T x maps (0, sqrt(3)) into itself and
  // converges to 1 there.
  for (int i = 0; i < iterations; ++i) {
    const Matrix a = MatMul(x, Transpose(x, m, n), m, n, m);
    const Matrix ax = MatMul(a, x, m, m, n);
    for (int64_t j = 0; j < m * n; ++j) x[j] = 1.5 * x[j] - 0.5 * ax[j];
  }
  return tall ? Transpose(x, m, n) : x;
}

void MuonStep(const Matrix& grad, int64_t rows, int64_t cols,
              const MuonHyperparameters& hyper, Matrix* momentum,
              Matrix* param) {
  const double mu = hyper.momentum;
  Matrix update(grad.size());
  for (size_t i = 0; i < grad.size(); ++i) {
    (*momentum)[i] += (1 - mu) * (grad[i] - (*momentum)[i]);
    update[i] = hyper.nesterov ? grad[i] + mu * ((*momentum)[i] - grad[i])
                               : (*momentum)[i];
  }
  const Matrix o = NewtonSchulz(update, rows, cols, hyper.ns);
  const double lr = AdjustedLr(hyper.lr, hyper.lr_adjustment, rows, cols);
  for (size_t i = 0; i < grad.size(); ++i) {
    (*param)[i] = (*param)[i] * (1 - hyper.lr * hyper.weight_decay) - lr * o[i];
  }
}

void AdamWStep(const Matrix& grad, const AdamWHyperparameters& hyper,
               int64_t step, Matrix* exp_avg, Matrix* exp_avg_sq,
               Matrix* param) {
  const double bias1 = 1 - std::pow(hyper.beta1, step);
  const double bias2 = 1 - std::pow(hyper.beta2, step);
  for (size_t i = 0; i < grad.size(); ++i) {
    (*param)[i] *= 1 - hyper.lr * hyper.weight_decay;
    (*exp_avg)[i] = hyper.beta1 * (*exp_avg)[i] + (1 - hyper.beta1) * grad[i];
    (*exp_avg_sq)[i] =
        hyper.beta2 * (*exp_avg_sq)[i] + (1 - hyper.beta2) * grad[i] * grad[i];
    const double m_hat = (*exp_avg)[i] / bias1;
    const double denom = std::sqrt((*exp_avg_sq)[i] / bias2) + hyper.eps;
    (*param)[i] -= hyper.lr * m_hat / denom;
  }
}

double RelativeError(const std::vector<float>& a, const Matrix& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  return RelativeError(a, Matrix(b.begin(), b.end()));
}

}  // namespace reference
}  // namespace kernels
}  // namespace muonps
