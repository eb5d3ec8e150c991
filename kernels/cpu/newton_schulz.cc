#include "kernels/cpu/newton_schulz.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/cpu/symmetric_ops.h"

namespace muonps {
namespace kernels {
namespace cpu {
namespace {

// Workspace slots.
enum Slot {
  kX,     // the m x n iterate (X0 for Gram NS)
  kY,     // a second m x n buffer
  kA,     // m x m: A = X X^T (NS5) or R (Gram)
  kB,     // m x m: A^2 or R^2, then the polynomial P
  kQ,     // m x m: Gram NS accumulated polynomial Q
  kTmp,   // m x m scratch
  kTmp2,  // m x m scratch
};

// Copies `in` (rows x cols) into x as the wide orientation m x n.
void LoadWide(const float* in, int64_t rows, int64_t cols, float* x) {
  if (rows <= cols) {
    std::memcpy(x, in, sizeof(float) * rows * cols);
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) x[j * rows + i] = in[i * cols + j];
  }
}

// Inverse of LoadWide.
void StoreWide(const float* x, int64_t rows, int64_t cols, float* out) {
  if (rows <= cols) {
    std::memcpy(out, x, sizeof(float) * rows * cols);
    return;
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = x[j * rows + i];
  }
}

// x <- x / max(margin * ||x||_F, eps). The sum of squares runs in double so
// neither values near FLT_MAX nor subnormals overflow or vanish.
void Normalize(float* x, int64_t count, double margin, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += static_cast<double>(x[i]) * x[i];
  const double denom = std::max(margin * std::sqrt(sum), eps);
  const float inv = static_cast<float>(1.0 / denom);
  // Multiplying by an fp32 reciprocal of a denormal-range norm could
  // overflow; divide in double when the reciprocal is not a normal float.
  if (std::isnormal(inv)) {
    for (int64_t i = 0; i < count; ++i) x[i] *= inv;
  } else {
    for (int64_t i = 0; i < count; ++i) {
      x[i] = static_cast<float>(x[i] / denom);
    }
  }
}

// AOL preconditioning (NewtonSchulzOptions::aol): x <- S x with
// S = diag(1 / (margin * sqrt(sum_j |(x x^T)_ij|))). Rows of zeros keep
// S_ii = 1 (they stay zero).
void AolPrecondition(float* x, int64_t m, int64_t n, double margin,
                     float* gram) {
  GramMatrix(x, m, n, gram);
  for (int64_t i = 0; i < m; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < m; ++j) sum += std::fabs(gram[i * m + j]);
    if (!(sum > 0) || !std::isfinite(sum)) continue;
    const float s = static_cast<float>(1.0 / (margin * std::sqrt(sum)));
    for (int64_t j = 0; j < n; ++j) x[i * n + j] *= s;
  }
}

// p <- a I + b r + c r2, all m x m.
void Polynomial(const NsCoefficients& k, const float* r, const float* r2,
                int64_t m, float* p) {
  const float b = static_cast<float>(k.b);
  const float c = static_cast<float>(k.c);
  for (int64_t i = 0; i < m * m; ++i) p[i] = b * r[i] + c * r2[i];
  const float a = static_cast<float>(k.a);
  for (int64_t i = 0; i < m; ++i) p[i * m + i] += a;
}

// y <- q x for m x m q and m x n x.
void LeftMultiply(const float* q, const float* x, int64_t m, int64_t n,
                  float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0f, q, m, x,
              n, 0.0f, y, n);
}

// R = X X^T has the squared row norms of X on its diagonal: a negative or
// non-finite entry means rounding has pushed R off the PSD cone, after which
// its small eigenvalues grow geometrically.
bool DiagonalHealthy(const float* r, int64_t m) {
  for (int64_t i = 0; i < m; ++i) {
    const float d = r[i * m + i];
    if (!(d >= 0.0f) || !std::isfinite(d)) return false;
  }
  return true;
}

// Dense quintic iteration on x (m x n); returns the buffer holding X_k.
float* IterateNs5(float* x, int64_t m, int64_t n,
                  const NewtonSchulzOptions& options, NsWorkspace* ws) {
  float* y = ws->Buffer(kY, m * n);
  float* a = ws->Buffer(kA, m * m);
  float* a2 = ws->Buffer(kB, m * m);
  float* b = ws->Buffer(kTmp, m * m);
  for (int step = 0; step < options.steps; ++step) {
    const NsCoefficients k = CoefficientsForStep(options, step);
    GramMatrix(x, m, n, a);
    SymmetricSquare(a, m, a2);
    const float kb = static_cast<float>(k.b);
    const float kc = static_cast<float>(k.c);
    for (int64_t i = 0; i < m * m; ++i) b[i] = kb * a[i] + kc * a2[i];
    // y <- a x + b x: the `a` term rides in the GEMM's beta.
    std::memcpy(y, x, sizeof(float) * m * n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0f, b, m,
                x, n, static_cast<float>(k.a), y, n);
    std::swap(x, y);
  }
  return x;
}

// Gram iteration: R = X0 X0^T; per step P = aI + bR + cR^2, Q <- P Q,
// R <- P R P; X = Q X0 at the end. Restarts re-form X and R from Q.
float* IterateGram(float* x0, int64_t m, int64_t n,
                   const NewtonSchulzOptions& options, NsWorkspace* ws) {
  float* x1 = ws->Buffer(kY, m * n);
  float* r = ws->Buffer(kA, m * m);
  float* p = ws->Buffer(kB, m * m);
  float* q = ws->Buffer(kQ, m * m);
  float* tmp = ws->Buffer(kTmp, m * m);
  float* tmp2 = ws->Buffer(kTmp2, m * m);
  GramMatrix(x0, m, n, r);
  bool q_is_identity = true;
  for (int step = 0; step < options.steps; ++step) {
    const NsCoefficients k = CoefficientsForStep(options, step);
    SymmetricSquare(r, m, tmp);
    Polynomial(k, r, tmp, m, p);
    if (q_is_identity) {
      std::memcpy(q, p, sizeof(float) * m * m);
      q_is_identity = false;
    } else {
      CommutingProduct(p, q, m, tmp);
      std::swap(q, tmp);
    }
    if (step + 1 == options.steps) break;
    bool restart =
        std::find(options.gram_restarts.begin(), options.gram_restarts.end(),
                  step + 1) != options.gram_restarts.end();
    if (!restart) {
      CommutingProduct(p, r, m, tmp);
      CommutingProduct(tmp, p, m, tmp2);
      std::swap(r, tmp2);
      restart = !DiagonalHealthy(r, m);
    }
    if (restart) {
      LeftMultiply(q, x0, m, n, x1);
      std::swap(x0, x1);
      GramMatrix(x0, m, n, r);
      q_is_identity = true;
    }
  }
  if (q_is_identity) return x0;
  LeftMultiply(q, x0, m, n, x1);
  return x1;
}

}  // namespace

float* NsWorkspace::Buffer(int slot, int64_t elements) {
  if (static_cast<int>(buffers_.size()) <= slot) buffers_.resize(slot + 1);
  std::vector<float>& buffer = buffers_[slot];
  if (static_cast<int64_t>(buffer.size()) < elements) buffer.resize(elements);
  return buffer.data();
}

void Orthogonalize(const float* in, int64_t rows, int64_t cols,
                   const NewtonSchulzOptions& options, float* out,
                   NsWorkspace* ws) {
  const int64_t m = std::min(rows, cols);
  const int64_t n = std::max(rows, cols);
  float* x = ws->Buffer(kX, m * n);
  LoadWide(in, rows, cols, x);
  Normalize(x, m * n, NormalizationMargin(options), options.eps);
  if (options.aol) {
    AolPrecondition(x, m, n, NormalizationMargin(options),
                    ws->Buffer(kTmp, m * m));
  }
  float* result = options.algorithm == NsAlgorithm::kGram
                      ? IterateGram(x, m, n, options, ws)
                      : IterateNs5(x, m, n, options, ws);
  StoreWide(result, rows, cols, out);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace muonps
