// A cuBLASLt pointer-array batched GEMM (C_i <- alpha op(A_i) op(B_i) +
// beta C_i, inputs bf16/fp16/fp32, fp32 C, fp32 accumulation) whose
// algorithm is chosen by timing: the lower-triangle tiles of LowerProduct
// (symmetric_gemm.h) in SymmetricMode::kLtTiles. cuBLAS's own
// cublasGemmBatchedEx picks 128x128 tiles for these problems, which ncu
// showed L2-bound (82% L2 throughput, 47-67% SM); the search tries every
// tile and cluster shape cuBLASLt's heuristic offers.
//
// Search synchronizes the device and must not run during a graph capture;
// Run is asynchronous on its stream and capturable. Thread-compatible; not
// copyable.
#ifndef MUONPS_KERNELS_CUDA_LT_TILE_GEMM_H_
#define MUONPS_KERNELS_CUDA_LT_TILE_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace kernels {
namespace cuda {

class LtTileGemm {
 public:
  // Column-major problem: every instance is M = N = t, K = k.
  struct Shape {
    cudaDataType input_type = CUDA_R_16BF;
    cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    int64_t t = 0, k = 0, lda = 0, ldb = 0, ldc = 0, batch = 0;
  };
  // One timed candidate: its heuristic rank, tile and cluster ids
  // (cublasLtMatmulTile_t, cublasLtClusterShape_t) and median ms.
  struct Trial {
    int rank = 0;
    int tile = 0;
    int cluster = 0;
    double ms = 0;
  };

  // The same product by other means (cuBLAS's cublasGemmBatchedEx), queued
  // on the stream it is given; timed beside the candidates.
  using Baseline = std::function<bool(cudaStream_t)>;

  // Times up to `candidates` of cuBLASLt's heuristic algorithms and
  // `baseline` on the device pointer arrays a, b and c (whose C tiles it
  // overwrites with garbage: call before the buffers hold data) and keeps
  // the fastest candidate. `workspace` (device, `workspace_bytes`) must
  // outlive the object. FAILED_PRECONDITION when no candidate runs.
  static absl::StatusOr<std::unique_ptr<LtTileGemm>> Search(
      cublasLtHandle_t lt, const Shape& shape, const void* const* a,
      const void* const* b, void* const* c, void* workspace,
      size_t workspace_bytes, const Baseline& baseline, int candidates = 24);

  LtTileGemm(const LtTileGemm&) = delete;
  LtTileGemm& operator=(const LtTileGemm&) = delete;
  ~LtTileGemm();

  // Queues the GEMM on `stream` with the chosen algorithm.
  absl::Status Run(float alpha, const void* const* a, const void* const* b,
                   float beta, void* const* c, cudaStream_t stream) const;

  // Every candidate timed, in heuristic order; `best` indexes the winner.
  const std::vector<Trial>& trials() const { return trials_; }
  int best() const { return best_; }
  // The baseline's median ms (0 when it failed to run), and whether the
  // best candidate beat it (else callers should run the baseline).
  double baseline_ms() const { return baseline_ms_; }
  bool beats_baseline() const {
    return baseline_ms_ <= 0 || trials_[best_].ms < baseline_ms_;
  }

 private:
  LtTileGemm() = default;

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

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_LT_TILE_GEMM_H_
