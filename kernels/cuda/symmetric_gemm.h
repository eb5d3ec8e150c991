// The products of the GPU Newton-Schulz iteration, on stacks of same-shape
// matrices, with fp32 accumulation:
//  - LowerProduct: C <- alpha L R^T + beta C where the result is known to be
//    symmetric (X X^T, or a product of commuting symmetric matrices), so
//    only its lower triangle is computed (cuBLAS: dense, in row blocks, or
//    as equal lower-triangle tiles in one pointer-array batched GEMM, by
//    cuBLAS or by a timed cuBLASLt algorithm);
//  - LowerProductCombine: the same, followed by a SymmetricCombine of the
//    product (ns_elementwise.h) as a second pass;
//  - LeftMultiply: Y <- alpha Q W + beta Y for symmetric m x m Q (cuBLAS).
//
// Wide m x k operands are addressed in place, row-major or column-major (a
// tall row-major matrix is its wide transpose stored column-major), so no
// transpose is ever materialized. Calls are asynchronous on the handle's
// stream and can be captured into CUDA graphs. Thread-compatible.
#ifndef MUONPS_KERNELS_CUDA_SYMMETRIC_GEMM_H_
#define MUONPS_KERNELS_CUDA_SYMMETRIC_GEMM_H_

#include <cublas_v2.h>
#include <library_types.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/lt_gemm.h"
#include "kernels/cuda/ns_elementwise.h"

namespace muonps {
namespace kernels {
namespace cuda {

// A stack of `count` m x k matrices: matrix i starts `stride` elements after
// matrix i - 1; element (r, c) lies at r * ld + c (row_major) or c * ld + r.
struct StackOperand {
  const void* data = nullptr;
  int64_t stride = 0;
  int64_t ld = 0;
  bool row_major = true;
};

// Row-major m x m matrices stored back to back (symmetric ones are the same
// in either layout).
inline StackOperand SquareStack(const void* data, int64_t m) {
  return {data, m * m, m, true};
}

enum class SymmetricMode {
  kDense,      // one full GEMM; the lower triangle is read from it
  kRowBlocks,  // row block i computes columns [0, end of block i)
  kTiles,      // the blocks (blocks + 1) / 2 lower tiles in one call
  kLtTiles,    // the same tiles in one cuBLASLt call, algorithm by timing
};

struct SymmetricPlan {
  SymmetricMode mode = SymmetricMode::kRowBlocks;
  int blocks = 4;
  // Fewer blocks are used where blocks would have fewer rows than this.
  int min_block_rows = 128;
};

// The plan actually run for m: as many blocks as allowed (at most `blocks`)
// of at least `min_block_rows` rows, kDense when that is one; kTiles needs
// m divisible by the blocks (tiles a multiple of 8 rows) and falls back to
// kRowBlocks otherwise; so does kLtTiles.
SymmetricPlan EffectivePlan(const SymmetricPlan& plan, int64_t m);

// Device arrays of per-tile operand pointers for one (l, r, c) triple of
// LowerProduct in kTiles mode (none when default-constructed), built once
// (outside any graph capture) and reused by every call on those buffers.
class TilePointers {
 public:
  static absl::StatusOr<TilePointers> Build(const StackOperand& l,
                                            const StackOperand& r, float* c,
                                            size_t input_bytes, int64_t count,
                                            int64_t m, int blocks);
  // The device arrays of A, B and C pointers, as TileShape's a, b and c.
  const void* a() const { return arrays_.as<const void*>(); }
  const void* b() const { return arrays_.as<const void*>() + tiles_; }
  void* c() const { return arrays_.as<void*>() + 2 * tiles_; }
  int64_t tiles() const { return tiles_; }
  // The timed cuBLASLt GEMM for kLtTiles (not owned), or null: cuBLAS's
  // cublasGemmBatchedEx then runs the tiles.
  const LtGemm* lt() const { return lt_; }
  void set_lt(const LtGemm* lt) { lt_ = lt; }

 private:
  DeviceBuffer arrays_;
  int64_t tiles_ = 0;
  const LtGemm* lt_ = nullptr;
};

// Lower triangle (row >= col) of c_i <- alpha * l_i r_i^T + beta * c_i for
// `count` m x k operands of `input_type` and row-major fp32 m x m c. The
// upper triangle of c is unspecified afterwards. `tiles` is required for an
// effective kTiles plan and must have been built for these buffers.
absl::Status LowerProduct(cublasHandle_t handle, const SymmetricPlan& plan,
                          cudaDataType input_type, int64_t count, int64_t m,
                          int64_t k, float alpha, const StackOperand& l,
                          const StackOperand& r, float beta, float* c,
                          const TilePointers* tiles);

// What is done with the product p: v = coef_other * other + coef_product *
// p (other null: coef_product * p) and the outputs of v.
struct ProductTerms : SymmetricOutputs {
  const float* other = nullptr;
  float coef_other = 0.0f;
  float coef_product = 1.0f;
};

// What LowerProductCombine does with the product p (lower triangle):
//   v = coef_other * other + coef_product * p  (other null: coef_product * p)
// and SymmetricCombine's outputs of v (value32: lower triangle only);
// `unhealthy` (with other null) counts p's bad diagonal entries. c holds p
// afterwards when keep_product (always when beta != 0, which reads it);
// otherwise it may serve as scratch.
struct ProductCombine : ProductTerms {
  bool keep_product = true;
};

// LowerProduct into c, then `combine` of it, on the handle's stream.
// INVALID_ARGUMENT, naming both, when an output is l, r or `other` (checked
// before anything is queued).
absl::Status LowerProductCombine(
    cublasHandle_t handle, const SymmetricPlan& plan, cudaDataType input_type,
    int64_t count, int64_t m, int64_t k, float alpha, const StackOperand& l,
    const StackOperand& r, float beta, float* c, const TilePointers* tiles,
    const ProductCombine& combine);

// y_i <- alpha * q_i w_i + beta * y_i for symmetric row-major m x m q (of
// `input_type`) and m x n w (of `input_type`); y (of `output_type`) has w's
// layout and stride. Runs on `lt` (a search of LeftMultiplyShape for these
// arguments) where given, else on cuBLAS.
absl::Status LeftMultiply(cublasHandle_t handle, cudaDataType input_type,
                          cudaDataType output_type, int64_t count, int64_t m,
                          int64_t n, float alpha, const void* q,
                          const StackOperand& w, float beta, void* y,
                          const LtGemm* lt);

// The column-major strided GEMM LeftMultiply runs for these arguments
// (w.data's value is not used), and its A and B for q and w.
LtGemm::Shape LeftMultiplyShape(cudaDataType input_type,
                                cudaDataType output_type, int64_t count,
                                int64_t m, int64_t n, const StackOperand& w);
const void* LeftMultiplyA(const void* q, const StackOperand& w);
const void* LeftMultiplyB(const void* q, const StackOperand& w);

// The pointer-array GEMM of LowerProduct's `tiles` t x t lower-triangle
// tiles (kTiles, kLtTiles) of l r^T, with k-deep operands, into fp32 c of
// m columns.
LtGemm::Shape TileShape(cudaDataType input_type, int64_t m, int64_t t,
                        int64_t k, const StackOperand& l, const StackOperand& r,
                        int64_t tiles);

// Bytes per element of CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F.
size_t ElementBytes(cudaDataType type);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_SYMMETRIC_GEMM_H_
