#include "kernels/cpu/symmetric_ops.h"

#include <cblas.h>

#include <algorithm>

namespace muonps {
namespace kernels {
namespace cpu {
namespace {

// Rows per block of CommutingProduct: with B blocks the product costs
// (B + 1) / (2 B) of a dense one. Blocks of at least 128 rows keep each GEMM
// large enough for OpenBLAS to stay efficient (measured: 32-row blocks made
// Gram NS on 256 x 1024 slower than 128-row ones); at most 8 blocks.
int64_t BlockRows(int64_t m) {
  constexpr int64_t kBlocks = 8;
  constexpr int64_t kMinRows = 128;
  return std::max(kMinRows, (m + kBlocks - 1) / kBlocks);
}

}  // namespace

void MirrorLower(float* a, int64_t m) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = i + 1; j < m; ++j) a[i * m + j] = a[j * m + i];
  }
}

void GramMatrix(const float* x, int64_t m, int64_t n, float* out) {
  cblas_ssyrk(CblasRowMajor, CblasLower, CblasNoTrans, m, n, 1.0f, x, n, 0.0f,
              out, m);
  MirrorLower(out, m);
}

void SymmetricSquare(const float* a, int64_t m, float* out) {
  GramMatrix(a, m, m, out);
}

void CommutingProduct(const float* a, const float* b, int64_t m, float* out) {
  const int64_t block = BlockRows(m);
  for (int64_t row = 0; row < m; row += block) {
    const int64_t end = std::min(m, row + block);
    // Rows [row, end) of a b, columns [0, end): the block row's part of the
    // lower triangle plus the upper corner of its diagonal block.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, end - row, end, m,
                1.0f, a + row * m, m, b, m, 0.0f, out + row * m, m);
  }
  MirrorLower(out, m);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace muonps
