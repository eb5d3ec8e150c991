#include "kernels/cuda/lt_tile_gemm.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/stream_timer.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

// Layout of a stored operand whose op() is rows x cols.
cublasLtMatrixLayout_t Layout(cudaDataType type, cublasOperation_t op,
                              int64_t rows, int64_t cols, int64_t ld,
                              int64_t batch) {
  cublasLtMatrixLayout_t l = nullptr;
  const bool transposed = op != CUBLAS_OP_N;
  if (cublasLtMatrixLayoutCreate(&l, type, transposed ? cols : rows,
                                 transposed ? rows : cols,
                                 ld) != CUBLAS_STATUS_SUCCESS) {
    return nullptr;
  }
  const int32_t count = static_cast<int32_t>(batch);
  const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                   &count, sizeof(count));
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode,
                                   sizeof(mode));
  return l;
}

// cublasLtMatmul takes D as void*; in pointer-array mode it is the
// (device) array of output pointers, which it reads and never writes.
void* Mutable(void* const* c) { return const_cast<void**>(c); }

int ConfigInt(const cublasLtMatmulAlgo_t& algo,
              cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return static_cast<int>(v);
}

}  // namespace

LtTileGemm::~LtTileGemm() {
  if (la_ != nullptr) cublasLtMatrixLayoutDestroy(la_);
  if (lb_ != nullptr) cublasLtMatrixLayoutDestroy(lb_);
  if (lc_ != nullptr) cublasLtMatrixLayoutDestroy(lc_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

absl::StatusOr<std::unique_ptr<LtTileGemm>> LtTileGemm::Search(
    cublasLtHandle_t lt, const Shape& s, const void* const* a,
    const void* const* b, void* const* c, void* workspace,
    size_t workspace_bytes, const Baseline& baseline, int candidates) {
  std::unique_ptr<LtTileGemm> g(new LtTileGemm());
  g->lt_ = lt;
  g->workspace_ = workspace;
  g->workspace_bytes_ = workspace_bytes;
  const std::string what = absl::StrCat("cuBLASLt tile GEMM ", s.t, "x", s.t,
                                        "x", s.k, " batch ", s.batch);
  MUONPS_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescCreate(&g->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
      what));
  cublasLtMatmulDescSetAttribute(g->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &s.ta,
                                 sizeof(s.ta));
  cublasLtMatmulDescSetAttribute(g->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &s.tb,
                                 sizeof(s.tb));
  g->la_ = Layout(s.input_type, s.ta, s.t, s.k, s.lda, s.batch);
  g->lb_ = Layout(s.input_type, s.tb, s.k, s.t, s.ldb, s.batch);
  g->lc_ = Layout(CUDA_R_32F, CUBLAS_OP_N, s.t, s.t, s.ldc, s.batch);
  if (g->la_ == nullptr || g->lb_ == nullptr || g->lc_ == nullptr) {
    return absl::InternalError(absl::StrCat(what, ": layout creation failed"));
  }
  cublasLtMatmulPreference_t pref = nullptr;
  MUONPS_RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&pref), what));
  const uint64_t max_ws = workspace_bytes;
  cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws, sizeof(max_ws));
  std::vector<cublasLtMatmulHeuristicResult_t> found(std::max(1, candidates));
  int returned = 0;
  const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
      lt, g->desc_, g->la_, g->lb_, g->lc_, g->lc_, pref,
      static_cast<int>(found.size()), found.data(), &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  if (heuristic != CUBLAS_STATUS_SUCCESS || returned == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": cuBLASLt offers no algorithm"));
  }
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), what));
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<StreamTimer> timer,
                          StreamTimer::Create());
  const float alpha = 1.0f, beta = 1.0f;  // beta != 0: C is read, as in use
  // Median ms of `op` over 3 runs after a warm-up; negative if it failed.
  const auto time = [&](const std::function<bool(cudaStream_t)>& op) {
    const absl::StatusOr<double> ms = timer->MedianMs([&](cudaStream_t stream) {
      return op(stream) ? absl::OkStatus() : absl::InternalError("refused");
    });
    if (ms.ok()) return *ms;
    cudaGetLastError();  // a refused candidate is not an error
    return -1.0;
  };
  if (baseline) g->baseline_ms_ = std::max(0.0, time(baseline));
  double best_ms = 0;
  for (int i = 0; i < returned; ++i) {
    const cublasLtMatmulAlgo_t& algo = found[i].algo;
    const double ms = time([&](cudaStream_t stream) {
      return cublasLtMatmul(lt, g->desc_, &alpha, a, g->la_, b, g->lb_, &beta,
                            c, g->lc_, Mutable(c), g->lc_, &algo, workspace,
                            workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
    });
    if (ms < 0) continue;
    Trial t;
    t.rank = i;
    t.tile = ConfigInt(algo, CUBLASLT_ALGO_CONFIG_TILE_ID);
    t.cluster = ConfigInt(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID);
    t.ms = ms;
    if (g->best_ < 0 || t.ms < best_ms) {
      g->best_ = static_cast<int>(g->trials_.size());
      best_ms = t.ms;
      g->algo_ = algo;
    }
    g->trials_.push_back(t);
  }
  if (g->best_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": no cuBLASLt candidate ran"));
  }
  return g;
}

absl::Status LtTileGemm::Run(float alpha, const void* const* a,
                             const void* const* b, float beta, void* const* c,
                             cudaStream_t stream) const {
  return CublasStatus(cublasLtMatmul(lt_, desc_, &alpha, a, la_, b, lb_, &beta,
                                     c, lc_, Mutable(c), lc_, &algo_,
                                     workspace_, workspace_bytes_, stream),
                      "cublasLtMatmul (tiles)");
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
