#include "kernels/cuda/symmetric_gemm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/cublas_status.h"
#include "kernels/cuda/ns_elementwise.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

// cuBLAS is column-major: a row-major block of rows is a column-major
// matrix of columns. For C = L R^T (row-major) the column-major call
// computes C^T = R L^T: A is a block of rows of R (M x K), B is a block of
// rows of L, transposed (K x N).
cublasOperation_t RowsAsA(const StackOperand& x) {
  return x.row_major ? CUBLAS_OP_T : CUBLAS_OP_N;
}
cublasOperation_t RowsAsB(const StackOperand& x) {
  return x.row_major ? CUBLAS_OP_N : CUBLAS_OP_T;
}

// Address of row `row` of matrix `matrix` of x.
const void* RowAddress(const StackOperand& x, size_t bytes, int64_t matrix,
                       int64_t row) {
  const int64_t offset = matrix * x.stride + (x.row_major ? row * x.ld : row);
  return static_cast<const char*>(x.data) + offset * bytes;
}

// Lower-triangle block: rows [r0, r0 + rows) and columns [c0, c0 + cols).
absl::Status BlockProduct(cublasHandle_t handle, cudaDataType input_type,
                          int64_t count, int64_t m, int64_t k, float alpha,
                          const StackOperand& l, const StackOperand& r,
                          float beta, float* c, int64_t r0, int64_t rows,
                          int64_t c0, int64_t cols) {
  const size_t bytes = ElementBytes(input_type);
  LtGemm::Shape s;
  s.input_type = input_type;
  s.output_type = CUDA_R_32F;
  s.ta = RowsAsA(r);
  s.tb = RowsAsB(l);
  s.m = cols;
  s.n = rows;
  s.k = k;
  s.lda = r.ld;
  s.ldb = l.ld;
  s.ldc = m;
  s.batch = count;
  s.strided = true;
  s.stride_a = r.stride;
  s.stride_b = l.stride;
  s.stride_c = m * m;
  return CublasGemm(handle, s, alpha, RowAddress(r, bytes, 0, c0),
                    RowAddress(l, bytes, 0, r0), beta, c + r0 * m + c0);
}

// An output that is also an input (l, r or `other`) would be read
// half-written (the combine pass reads `other` while it writes, and a
// fused product and combine would read l and r), so LowerProductCombine
// refuses it on every plan.
absl::Status CheckNoAliasing(const StackOperand& l, const StackOperand& r,
                             const ProductCombine& combine) {
  const std::pair<const void*, const char*> outputs[] = {
      {combine.value32, "value32"},
      {combine.value_low, "value_low"},
      {combine.with_diag_low, "with_diag_low"}};
  const std::pair<const void*, const char*> inputs[] = {
      {l.data, "l"}, {r.data, "r"}, {combine.other, "other"}};
  for (const auto& [out, out_name] : outputs) {
    if (out == nullptr) continue;
    for (const auto& [in, in_name] : inputs) {
      if (out == in) {
        return absl::InvalidArgumentError(
            absl::StrCat("LowerProductCombine: output ", out_name,
                         " is the input ", in_name));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

size_t ElementBytes(cudaDataType type) { return type == CUDA_R_32F ? 4 : 2; }

LtGemm::Shape TileShape(cudaDataType input_type, int64_t m, int64_t t,
                        int64_t k, const StackOperand& l, const StackOperand& r,
                        int64_t tiles) {
  LtGemm::Shape s;
  s.input_type = input_type;
  s.output_type = CUDA_R_32F;
  s.ta = RowsAsA(r);
  s.tb = RowsAsB(l);
  s.m = s.n = t;
  s.k = k;
  s.lda = r.ld;
  s.ldb = l.ld;
  s.ldc = m;
  s.batch = tiles;
  return s;
}

LtGemm::Shape LeftMultiplyShape(cudaDataType input_type,
                                cudaDataType output_type, int64_t count,
                                int64_t m, int64_t n, const StackOperand& w) {
  // Row-major W: Y^T = W^T Q (column-major n x m). Column-major W: Y = Q W.
  const bool row_major = w.row_major;
  LtGemm::Shape s;
  s.input_type = input_type;
  s.output_type = output_type;
  s.m = row_major ? n : m;
  s.n = row_major ? m : n;
  s.k = m;
  s.lda = row_major ? w.ld : m;
  s.ldb = row_major ? m : w.ld;
  s.ldc = w.ld;
  s.batch = count;
  s.strided = true;
  s.stride_a = row_major ? w.stride : m * m;
  s.stride_b = row_major ? m * m : w.stride;
  s.stride_c = w.stride;
  return s;
}

const void* LeftMultiplyA(const void* q, const StackOperand& w) {
  return w.row_major ? w.data : q;
}
const void* LeftMultiplyB(const void* q, const StackOperand& w) {
  return w.row_major ? q : w.data;
}

SymmetricPlan EffectivePlan(const SymmetricPlan& plan, int64_t m) {
  SymmetricPlan out = plan;
  const int64_t min_rows = std::max(1, plan.min_block_rows);
  const int64_t blocks = std::min<int64_t>(std::max(1, plan.blocks),
                                           std::max<int64_t>(1, m / min_rows));
  out.blocks = static_cast<int>(blocks);
  if (plan.mode == SymmetricMode::kDense || blocks <= 1) {
    out.mode = SymmetricMode::kDense;
    out.blocks = 1;
    return out;
  }
  if ((out.mode == SymmetricMode::kTiles ||
       out.mode == SymmetricMode::kLtTiles) &&
      (m % blocks != 0 || (m / blocks) % 8 != 0)) {
    out.mode = SymmetricMode::kRowBlocks;
  }
  return out;
}

absl::StatusOr<TilePointers> TilePointers::Build(const StackOperand& l,
                                                 const StackOperand& r,
                                                 float* c, size_t input_bytes,
                                                 int64_t count, int64_t m,
                                                 int blocks) {
  const int64_t t = m / blocks;
  const int64_t per_matrix = static_cast<int64_t>(blocks) * (blocks + 1) / 2;
  TilePointers tiles;
  tiles.tiles_ = count * per_matrix;
  std::vector<const void*> host(3 * tiles.tiles_);
  int64_t at = 0;
  for (int64_t b = 0; b < count; ++b) {
    for (int64_t i = 0; i < blocks; ++i) {
      for (int64_t j = 0; j <= i; ++j, ++at) {
        host[at] = RowAddress(r, input_bytes, b, j * t);
        host[tiles.tiles_ + at] = RowAddress(l, input_bytes, b, i * t);
        host[2 * tiles.tiles_ + at] = c + b * m * m + i * t * m + j * t;
      }
    }
  }
  const size_t bytes = host.size() * sizeof(void*);
  MUONPS_ASSIGN_OR_RETURN(tiles.arrays_,
                          DeviceBuffer::Allocate(bytes, "GEMM tile pointers"));
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(tiles.arrays_.get(), host.data(),
                                               bytes, cudaMemcpyHostToDevice),
                                    "copying GEMM tile pointers to the GPU"));
  return tiles;
}

absl::Status LowerProduct(cublasHandle_t handle, const SymmetricPlan& plan,
                          cudaDataType input_type, int64_t count, int64_t m,
                          int64_t k, float alpha, const StackOperand& l,
                          const StackOperand& r, float beta, float* c,
                          const TilePointers* tiles) {
  const SymmetricPlan run = EffectivePlan(plan, m);
  switch (run.mode) {
    case SymmetricMode::kDense:
      return BlockProduct(handle, input_type, count, m, k, alpha, l, r, beta, c,
                          0, m, 0, m);
    case SymmetricMode::kRowBlocks: {
      const int64_t rows = (m + run.blocks - 1) / run.blocks;
      for (int64_t r0 = 0; r0 < m; r0 += rows) {
        const int64_t height = std::min(rows, m - r0);
        MUONPS_RETURN_IF_ERROR(BlockProduct(handle, input_type, count, m, k,
                                            alpha, l, r, beta, c, r0, height, 0,
                                            r0 + height));
      }
      return absl::OkStatus();
    }
    case SymmetricMode::kLtTiles:
      if (tiles != nullptr && tiles->lt() != nullptr) {
        cudaStream_t stream = nullptr;
        MUONPS_RETURN_IF_ERROR(
            CublasStatus(cublasGetStream(handle, &stream), "cublasGetStream"));
        return tiles->lt()->Run(alpha, tiles->a(), tiles->b(), beta, tiles->c(),
                                stream);
      }
      [[fallthrough]];
    case SymmetricMode::kTiles: {
      if (tiles == nullptr || tiles->tiles() == 0) {
        return absl::InternalError("LowerProduct: tile pointers missing");
      }
      return CublasGemm(
          handle,
          TileShape(input_type, m, m / run.blocks, k, l, r, tiles->tiles()),
          alpha, tiles->a(), tiles->b(), beta, tiles->c());
    }
  }
  return absl::InternalError("LowerProduct: unknown mode");
}

absl::Status LowerProductCombine(
    cublasHandle_t handle, const SymmetricPlan& plan, cudaDataType input_type,
    int64_t count, int64_t m, int64_t k, float alpha, const StackOperand& l,
    const StackOperand& r, float beta, float* c, const TilePointers* tiles,
    const ProductCombine& combine) {
  MUONPS_RETURN_IF_ERROR(CheckNoAliasing(l, r, combine));
  cudaStream_t stream = nullptr;
  MUONPS_RETURN_IF_ERROR(
      CublasStatus(cublasGetStream(handle, &stream), "cublasGetStream"));
  MUONPS_RETURN_IF_ERROR(LowerProduct(handle, plan, input_type, count, m, k,
                                      alpha, l, r, beta, c, tiles));
  const bool nothing =
      combine.value32 == nullptr && combine.value_low == nullptr &&
      combine.with_diag_low == nullptr && combine.unhealthy == nullptr;
  if (nothing) return absl::OkStatus();
  SymmetricCombine pass;
  static_cast<SymmetricOutputs&>(pass) = combine;
  if (combine.other != nullptr) {
    pass.a = combine.other;
    pass.coef_a = combine.coef_other;
    pass.a2 = c;
    pass.coef_a2 = combine.coef_product;
  } else {
    pass.a = c;
    pass.coef_a = combine.coef_product;
  }
  pass.count = count;
  pass.m = m;
  pass.low_type = input_type;
  return CudaStatus(LaunchSymmetricCombine(pass, stream), "symmetric combine");
}

absl::Status LeftMultiply(cublasHandle_t handle, cudaDataType input_type,
                          cudaDataType output_type, int64_t count, int64_t m,
                          int64_t n, float alpha, const void* q,
                          const StackOperand& w, float beta, void* y,
                          const LtGemm* lt) {
  const void* a = LeftMultiplyA(q, w);
  const void* b = LeftMultiplyB(q, w);
  if (lt != nullptr) {
    cudaStream_t stream = nullptr;
    MUONPS_RETURN_IF_ERROR(
        CublasStatus(cublasGetStream(handle, &stream), "cublasGetStream"));
    return lt->Run(alpha, a, b, beta, y, stream);
  }
  return CublasGemm(handle,
                    LeftMultiplyShape(input_type, output_type, count, m, n, w),
                    alpha, a, b, beta, y);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
