#include "kernels/cuda/lt_gemm.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/cublas_status.h"
#include "kernels/cuda/stream_timer.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

int AsInt(int64_t v) { return static_cast<int>(v); }

std::string Describe(const LtGemm::Shape& s) {
  return absl::StrCat(s.m, "x", s.n, "x", s.k, ", ",
                      s.strided ? "strided" : "pointer-array", " batch ",
                      s.batch);
}

// Layout of a stored operand whose op() is rows x cols, in `batch` matrices
// `stride` elements apart (strided) or by pointer array.
cublasLtMatrixLayout_t Layout(cudaDataType type, cublasOperation_t op,
                              int64_t rows, int64_t cols, int64_t ld,
                              int64_t batch, bool strided, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  const bool transposed = op != CUBLAS_OP_N;
  if (cublasLtMatrixLayoutCreate(&l, type, transposed ? cols : rows,
                                 transposed ? rows : cols,
                                 ld) != CUBLAS_STATUS_SUCCESS) {
    return nullptr;
  }
  const int32_t count = static_cast<int32_t>(batch);
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                   &count, sizeof(count));
  if (strided) {
    cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
        sizeof(stride));
  } else {
    const uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE,
                                     &mode, sizeof(mode));
  }
  return l;
}

// The three layouts of `s` over `batch` matrices; owns them.
struct Layouts {
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  Layouts(const LtGemm::Shape& s, int64_t batch)
      : a(Layout(s.input_type, s.ta, s.m, s.k, s.lda, batch, s.strided,
                 s.stride_a)),
        b(Layout(s.input_type, s.tb, s.k, s.n, s.ldb, batch, s.strided,
                 s.stride_b)),
        c(Layout(s.output_type, CUBLAS_OP_N, s.m, s.n, s.ldc, batch, s.strided,
                 s.stride_c)) {}
  Layouts(const Layouts&) = delete;
  Layouts& operator=(const Layouts&) = delete;
  ~Layouts() {
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
  }
  bool ok() const { return a != nullptr && b != nullptr && c != nullptr; }
};

int ConfigInt(const cublasLtMatmulAlgo_t& algo,
              cublasLtMatmulAlgoConfigAttributes_t attr) {
  uint32_t v = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written);
  return static_cast<int>(v);
}

}  // namespace

absl::Status CublasGemm(cublasHandle_t handle, const LtGemm::Shape& s,
                        float alpha, const void* a, const void* b, float beta,
                        void* c) {
  if (s.strided) {
    return CublasStatus(
        cublasGemmStridedBatchedEx(
            handle, s.ta, s.tb, AsInt(s.m), AsInt(s.n), AsInt(s.k), &alpha, a,
            s.input_type, AsInt(s.lda), s.stride_a, b, s.input_type,
            AsInt(s.ldb), s.stride_b, &beta, c, s.output_type, AsInt(s.ldc),
            s.stride_c, AsInt(s.batch), CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT),
        absl::StrCat("cublasGemmStridedBatchedEx (", Describe(s), ")"));
  }
  return CublasStatus(
      cublasGemmBatchedEx(
          handle, s.ta, s.tb, AsInt(s.m), AsInt(s.n), AsInt(s.k), &alpha,
          static_cast<const void* const*>(a), s.input_type, AsInt(s.lda),
          static_cast<const void* const*>(b), s.input_type, AsInt(s.ldb), &beta,
          static_cast<void* const*>(c), s.output_type, AsInt(s.ldc),
          AsInt(s.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      absl::StrCat("cublasGemmBatchedEx (", Describe(s), ")"));
}

LtGemm::~LtGemm() {
  if (la_ != nullptr) cublasLtMatrixLayoutDestroy(la_);
  if (lb_ != nullptr) cublasLtMatrixLayoutDestroy(lb_);
  if (lc_ != nullptr) cublasLtMatrixLayoutDestroy(lc_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

absl::StatusOr<std::unique_ptr<LtGemm>> LtGemm::Search(
    cublasLtHandle_t lt, cublasHandle_t baseline, const Shape& s, const void* a,
    const void* b, void* c, void* workspace, size_t workspace_bytes,
    int candidates, int64_t timed_batch) {
  std::unique_ptr<LtGemm> g(new LtGemm());
  g->shape_ = s;
  g->lt_ = lt;
  g->workspace_ = workspace;
  g->workspace_bytes_ = workspace_bytes;
  const std::string what = absl::StrCat("cuBLASLt GEMM ", Describe(s));
  MUONPS_RETURN_IF_ERROR(CublasStatus(
      cublasLtMatmulDescCreate(&g->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F),
      what));
  cublasLtMatmulDescSetAttribute(g->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &s.ta,
                                 sizeof(s.ta));
  cublasLtMatmulDescSetAttribute(g->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &s.tb,
                                 sizeof(s.tb));
  Layouts run(s, s.batch);
  if (!run.ok()) {
    return absl::InternalError(absl::StrCat(what, ": layout creation failed"));
  }
  // The heuristic sees the shape that will run; the timing may see fewer
  // matrices of it.
  Shape timed = s;
  if (s.strided && timed_batch >= 1 && timed_batch < s.batch) {
    timed.batch = timed_batch;
  }
  Layouts trial(timed, timed.batch);
  if (!trial.ok()) {
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
      lt, g->desc_, run.a, run.b, run.c, run.c, pref,
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
  const auto time = [&](const std::function<absl::Status(cudaStream_t)>& op) {
    const absl::StatusOr<double> ms = timer->MedianMs(op);
    if (ms.ok()) return *ms;
    cudaGetLastError();  // a refused candidate is not an error
    return -1.0;
  };
  if (baseline != nullptr) {
    g->baseline_ms_ =
        std::max(0.0, time([&](cudaStream_t stream) {
                   MUONPS_RETURN_IF_ERROR(CublasStatus(
                       cublasSetStream(baseline, stream), "cublasSetStream"));
                   return CublasGemm(baseline, timed, alpha, a, b, beta, c);
                 }));
  }
  double best_ms = 0;
  for (int i = 0; i < returned; ++i) {
    const cublasLtMatmulAlgo_t& algo = found[i].algo;
    const double ms = time([&](cudaStream_t stream) {
      return CublasStatus(
          cublasLtMatmul(lt, g->desc_, &alpha, a, trial.a, b, trial.b, &beta, c,
                         trial.c, c, trial.c, &algo, workspace, workspace_bytes,
                         stream),
          what);
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
  g->la_ = run.a;
  g->lb_ = run.b;
  g->lc_ = run.c;
  run.a = run.b = run.c = nullptr;  // now owned by g
  return g;
}

absl::Status LtGemm::Run(float alpha, const void* a, const void* b, float beta,
                         void* c, cudaStream_t stream) const {
  return CublasStatus(
      cublasLtMatmul(lt_, desc_, &alpha, a, la_, b, lb_, &beta, c, lc_, c, lc_,
                     &algo_, workspace_, workspace_bytes_, stream),
      absl::StrCat("cublasLtMatmul (", Describe(shape_), ")"));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
