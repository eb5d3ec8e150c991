// fp64 twins of the Muon and AdamW formulas, written as plain loops with no
// BLAS, for tests to check the fp32 backends against. Slow; test use only.
//
// Matrices are row-major std::vector<double>. Functions are pure.
#ifndef MUONPS_KERNELS_REFERENCE_REFERENCE_MUON_H_
#define MUONPS_KERNELS_REFERENCE_REFERENCE_MUON_H_

#include <cstdint>
#include <vector>

#include "kernels/muon_kernels.h"

namespace muonps {
namespace kernels {
namespace reference {

using Matrix = std::vector<double>;

// c (m x n) = a (m x k) b (k x n).
Matrix MatMul(const Matrix& a, const Matrix& b, int64_t m, int64_t k,
              int64_t n);
Matrix Transpose(const Matrix& a, int64_t rows, int64_t cols);

// Dense NS (kernels/README.md) on a rows x cols matrix, in double.
Matrix NewtonSchulz(const Matrix& in, int64_t rows, int64_t cols,
                    const NewtonSchulzOptions& options);

// The polar factor U V^T of a full-rank rows x cols matrix U S V^T, in
// double, by `iterations` steps of the convergent cubic Newton-Schulz
// iteration from X / ||X||_F (quadratic once the smallest singular value
// nears 1: 60 suffice for singular values down to 1e-4 ||X||_F).
Matrix PolarFactor(const Matrix& in, int64_t rows, int64_t cols,
                   int iterations = 60);

// One torch.optim.Muon step on one matrix, in double.
void MuonStep(const Matrix& grad, int64_t rows, int64_t cols,
              const MuonHyperparameters& hyper, Matrix* momentum,
              Matrix* param);

// One torch.optim.AdamW step (`step` >= 1 counts this one), in double.
void AdamWStep(const Matrix& grad, const AdamWHyperparameters& hyper,
               int64_t step, Matrix* exp_avg, Matrix* exp_avg_sq,
               Matrix* param);

// ||a - b||_F / ||b||_F (|a - b|_F when b is zero).
double RelativeError(const std::vector<float>& a, const Matrix& b);
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace reference
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_REFERENCE_REFERENCE_MUON_H_
