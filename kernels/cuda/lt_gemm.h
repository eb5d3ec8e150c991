// A batched GEMM on cuBLASLt, C_i <- alpha op(A_i) op(B_i) + beta C_i
// (column-major; 16-bit or fp32 inputs, fp32 accumulation, C of
// `output_type`), whose algorithm is chosen by timing every candidate of
// cuBLASLt's heuristic beside the same product by cuBLAS (CublasGemm). The
// GPU Newton-Schulz uses it twice:
//  - the lower-triangle tiles of LowerProduct (symmetric_gemm.h) in
//    SymmetricMode::kLtTiles, a pointer-array batch: cuBLAS's
//    cublasGemmBatchedEx picks 128x128 tiles there, which ncu showed
//    L2-bound (82% L2 throughput, 47-67% SM);
//  - LeftMultiply's dense products X <- a X + Q X, a strided batch: on an
//    H200 the best of cuBLASLt's candidates (128x160 tiles) ran the Llama
//    shapes' products 3-4% faster than the cooperative kernel
//    cublasGemmStridedBatchedEx picks (ns_gpu_timing's micro_lt lines),
//    the whole shapes' NS 1-1.5% faster (bench/results/2026-11-27-
//    h200x1-ns-timing.jsonl and ...-h200x1-ns-dense-lt-ab.jsonl).
//
// Search synchronizes the device and must not run during a graph capture;
// Run is asynchronous on its stream and capturable. Thread-compatible; not
// copyable.
#ifndef MUONPS_KERNELS_CUDA_LT_GEMM_H_
#define MUONPS_KERNELS_CUDA_LT_GEMM_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace kernels {
namespace cuda {

class LtGemm {
 public:
  // op(A_i) is m x k, op(B_i) k x n, C_i m x n, all column-major.
  struct Shape {
    cudaDataType input_type = CUDA_R_16BF;
    cudaDataType output_type = CUDA_R_32F;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    int64_t m = 0, n = 0, k = 0;
    int64_t lda = 0, ldb = 0, ldc = 0, batch = 0;
    // Strided: matrix i of A starts stride_a elements after matrix i - 1
    // (likewise B and C), and a, b, c name matrix 0. Otherwise a pointer
    // array batch: a, b and c are device arrays of `batch` matrix pointers.
    bool strided = false;
    int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  };
  // One timed candidate: its heuristic rank, tile and cluster ids
  // (cublasLtMatmulTile_t, cublasLtClusterShape_t) and median ms.
  struct Trial {
    int rank = 0;
    int tile = 0;
    int cluster = 0;
    double ms = 0;
  };

  // Asks cuBLASLt's heuristic for up to `candidates` algorithms for `shape`
  // and times each, and the same product by cuBLAS on `baseline` (a handle
  // the search may point at its own stream), on a, b and c, whose C
  // matrices it overwrites with garbage (call before the buffers hold
  // data); keeps the fastest candidate. A strided shape is timed on its
  // first `timed_batch` matrices where that is in [1, batch) (so c need
  // only hold those), on all of them otherwise. `workspace` (device,
  // `workspace_bytes`) must outlive the object. FAILED_PRECONDITION when no
  // candidate runs.
  static absl::StatusOr<std::unique_ptr<LtGemm>> Search(
      cublasLtHandle_t lt, cublasHandle_t baseline, const Shape& shape,
      const void* a, const void* b, void* c, void* workspace,
      size_t workspace_bytes, int candidates = 24, int64_t timed_batch = 0);

  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;
  ~LtGemm();

  // Queues the GEMM on `stream` with the chosen algorithm; a, b and c as
  // for Search (matrix 0, or the pointer arrays).
  absl::Status Run(float alpha, const void* a, const void* b, float beta,
                   void* c, cudaStream_t stream) const;

  const Shape& shape() const { return shape_; }
  // Every candidate timed, in heuristic order; `best` indexes the winner.
  const std::vector<Trial>& trials() const { return trials_; }
  int best() const { return best_; }
  // cuBLAS's median ms (0 when it failed to run), and whether the best
  // candidate beat it (else callers should run cuBLAS).
  double baseline_ms() const { return baseline_ms_; }
  bool beats_baseline() const {
    return baseline_ms_ <= 0 || trials_[best_].ms < baseline_ms_;
  }

 private:
  LtGemm() = default;

  Shape shape_;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t la_ = nullptr, lb_ = nullptr, lc_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::vector<Trial> trials_;
  int best_ = -1;
  double baseline_ms_ = 0;
};

// The product of `shape` by cuBLAS (cublasGemmStridedBatchedEx for a
// strided shape, cublasGemmBatchedEx for a pointer-array one, default
// algorithm) on the handle's stream; a, b and c as for LtGemm::Run. Errors
// name the call and the shape.
absl::Status CublasGemm(cublasHandle_t handle, const LtGemm::Shape& shape,
                        float alpha, const void* a, const void* b, float beta,
                        void* c);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_LT_GEMM_H_
