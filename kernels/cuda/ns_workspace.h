// GPU scratch memory of the Newton-Schulz iteration for one stack shape
// (count matrices of rows x cols) and GEMM input type: allocated once, on
// first use of each algorithm, and reused by every later call (and by the
// CUDA graphs captured over it), so steady-state steps allocate nothing.
//
// Not thread-safe; owned by one NsEngine.
#ifndef MUONPS_KERNELS_CUDA_NS_WORKSPACE_H_
#define MUONPS_KERNELS_CUDA_NS_WORKSPACE_H_

#include <cublas_v2.h>
#include <library_types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/lt_gemm.h"
#include "kernels/cuda/symmetric_gemm.h"
#include "newton_schulz/options.h"

namespace muonps {
namespace kernels {
namespace cuda {

class NsWorkspace {
 public:
  NsWorkspace(int64_t count, int64_t rows, int64_t cols, cudaDataType low,
              const SymmetricPlan& plan);
  NsWorkspace(const NsWorkspace&) = delete;
  NsWorkspace& operator=(const NsWorkspace&) = delete;
  ~NsWorkspace();

  // Allocates what `algorithm` needs and was not allocated yet, and builds
  // the GEMM tile pointers it uses. Must not run during a graph capture.
  // Under a kLtTiles plan the first call also chooses, by timing this
  // shape's products, between cuBLASLt's tiles and cuBLAS's tiles of half
  // the rows (which is faster differs by device: see ChooseTilePlan), and
  // times cuBLASLt's algorithms for the dense products X <- a X + Q X
  // against cuBLAS's (left_multiply); it synchronizes the device then.
  absl::Status Prepare(NsAlgorithm algorithm);

  int64_t count() const { return count_; }
  int64_t m() const { return m_; }  // min(rows, cols)
  int64_t n() const { return n_; }  // max(rows, cols)
  cudaDataType low() const { return low_; }
  const SymmetricPlan& plan() const { return plan_; }

  // The wide m x n view of a stack of this shape stored at `data` (row-major
  // when rows <= cols, else the column-major transpose).
  StackOperand Wide(const void* data) const;

  // count * m * n GEMM-input copy of the iterate.
  void* x_low() const { return x_low_.get(); }
  // count * m * m fp32 matrices (A or R, A^2 or R^2, Gram's D = Q - c I).
  float* square32(int i) const { return square32_[i].as<float>(); }
  // count * m * m GEMM-input matrices (A or R, B or M, Q, P R or D, and
  // Gram's second Q: a product P Q writes the next Q while reading this one).
  void* square_low(int i) const { return square_low_[i].get(); }
  // count doubles: per-matrix sums of squares.
  double* sums() const { return sums_.as<double>(); }
  // count * m floats: per-row AOL scales (NewtonSchulzOptions::aol).
  float* scales() const { return scales_.as<float>(); }
  // One counter of unhealthy Gram diagonals (see SymmetricCombine).
  unsigned int* unhealthy() const { return unhealthy_.as<unsigned int>(); }

  // The searched cuBLASLt GEMM for LeftMultiply(q, Wide(x), fp32 y) on this
  // shape, or null: cuBLAS runs it (plans other than kLtTiles, a search
  // that found nothing faster, or too little scratch to time one matrix).
  const LtGemm* left_multiply() const { return left_gemm_.get(); }

  // Tile pointers for LowerProduct(l, r, c) in kTiles mode, or null when the
  // effective plan does not use tiles (or the triple was never prepared).
  const TilePointers* Tiles(const void* l, const void* r, const float* c) const;

 private:
  absl::Status Ensure(DeviceBuffer* buffer, size_t bytes, const char* what);
  // Ensure for a GEMM-input buffer of `elements` in low_; with timed_, a
  // new one is filled with random values (see LaunchFillRandom).
  absl::Status EnsureOperand(DeviceBuffer* buffer, size_t elements,
                             const char* what);
  // Builds the tile pointers of every product of `algorithm`.
  absl::Status AddAllTiles(NsAlgorithm algorithm);
  // Sets plan_ to the faster for this shape of the kLtTiles plan and the
  // kTiles plan of twice its blocks, timing `algorithm`'s products (X X^T
  // and a square one, weighted by how often it runs each).
  absl::Status ChooseTilePlan(NsAlgorithm algorithm);
  // `k` is the operands' inner dimension (n for X, m for squares).
  absl::Status AddTiles(const void* l, const StackOperand& lo, const void* r,
                        const StackOperand& ro, float* c, int64_t k);
  // The timed cuBLASLt GEMM for tiles of this layout (kLtTiles), searched on
  // first use on `tiles`' buffers; null where cuBLASLt offers none or none
  // faster than cublasGemmBatchedEx on the same tiles.
  absl::StatusOr<const LtGemm*> LtFor(const StackOperand& lo,
                                      const StackOperand& ro, int64_t k,
                                      const TilePointers& tiles);
  // Sets left_gemm_ when cuBLASLt beats cuBLAS on LeftMultiply's product.
  absl::Status SearchLeftMultiply();
  // The cuBLASLt handle, the baseline cuBLAS handle and the workspace.
  absl::Status EnsureLt();

  int64_t count_, m_, n_;
  bool row_major_;
  cudaDataType low_;
  SymmetricPlan plan_;
  // Created with kLtTiles: choices by timing (tile plan, dense products).
  const bool timed_;
  bool plan_chosen_ = false;
  bool left_searched_ = false;
  // What the searches chose and measured, for the log line at first use.
  std::string tile_choice_ = "symmetric products on the plan's tiles";
  std::string dense_choice_;
  DeviceBuffer x_low_;
  DeviceBuffer square32_[3];
  DeviceBuffer square_low_[5];
  DeviceBuffer sums_;
  DeviceBuffer scales_;
  DeviceBuffer unhealthy_;
  std::map<std::tuple<const void*, const void*, const float*>, TilePointers>
      tiles_;
  cublasLtHandle_t lt_ = nullptr;  // created on first kLtTiles search
  cublasHandle_t baseline_handle_ = nullptr;  // times cuBLAS's own, beside
  DeviceBuffer lt_workspace_;
  // (k, op A, op B, lda, ldb) -> the searched GEMM, or null.
  std::map<std::tuple<int64_t, int, int, int64_t, int64_t>,
           std::unique_ptr<LtGemm>>
      lt_gemms_;
  std::unique_ptr<LtGemm> left_gemm_;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_NS_WORKSPACE_H_
