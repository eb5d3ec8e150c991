#include "kernels/cuda/ns_workspace.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/cublas_status.h"
#include "kernels/cuda/ns_elementwise.h"
#include "kernels/cuda/stream_timer.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

std::string PlanName(const SymmetricPlan& plan) {
  return absl::StrCat(
      plan.mode == SymmetricMode::kLtTiles ? "cuBLASLt" : "cuBLAS",
      " tiles of ", plan.blocks, " blocks");
}

}  // namespace

NsWorkspace::NsWorkspace(int64_t count, int64_t rows, int64_t cols,
                         cudaDataType low, const SymmetricPlan& plan)
    : count_(count),
      m_(std::min(rows, cols)),
      n_(std::max(rows, cols)),
      row_major_(rows <= cols),
      low_(low),
      plan_(plan),
      timed_(plan.mode == SymmetricMode::kLtTiles) {}

NsWorkspace::~NsWorkspace() {
  lt_gemms_.clear();
  left_gemm_.reset();
  if (lt_ != nullptr) cublasLtDestroy(lt_);
  if (baseline_handle_ != nullptr) cublasDestroy(baseline_handle_);
}

StackOperand NsWorkspace::Wide(const void* data) const {
  return {data, m_ * n_, row_major_ ? n_ : m_, row_major_};
}

absl::Status NsWorkspace::Ensure(DeviceBuffer* buffer, size_t bytes,
                                 const char* what) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  MUONPS_ASSIGN_OR_RETURN(
      *buffer,
      DeviceBuffer::Allocate(bytes, absl::StrCat("Newton-Schulz ", what, " of ",
                                                 count_, "x", m_, "x", n_)));
  return absl::OkStatus();
}

absl::Status NsWorkspace::EnsureLt() {
  if (lt_ == nullptr) {
    MUONPS_RETURN_IF_ERROR(
        CublasStatus(cublasLtCreate(&lt_), "cublasLtCreate"));
  }
  if (baseline_handle_ == nullptr) {
    MUONPS_RETURN_IF_ERROR(
        CublasStatus(cublasCreate(&baseline_handle_), "cublasCreate"));
  }
  return Ensure(&lt_workspace_, size_t{32} << 20, "cuBLASLt workspace");
}

absl::StatusOr<const LtGemm*> NsWorkspace::LtFor(const StackOperand& lo,
                                                 const StackOperand& ro,
                                                 int64_t k,
                                                 const TilePointers& tiles) {
  const SymmetricPlan run = EffectivePlan(plan_, m_);
  const LtGemm::Shape shape =
      TileShape(low_, m_, m_ / run.blocks, k, lo, ro, tiles.tiles());
  const auto key = std::make_tuple(k, static_cast<int>(shape.ta),
                                   static_cast<int>(shape.tb), ro.ld, lo.ld);
  const auto it = lt_gemms_.find(key);
  if (it != lt_gemms_.end()) return it->second.get();
  MUONPS_RETURN_IF_ERROR(EnsureLt());
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm =
      LtGemm::Search(lt_, baseline_handle_, shape, tiles.a(), tiles.b(),
                     tiles.c(), lt_workspace_.get(), lt_workspace_.bytes());
  // No cuBLASLt algorithm, or none faster than cuBLAS's own batched GEMM:
  // cublasGemmBatchedEx runs these tiles.
  std::unique_ptr<LtGemm> kept =
      gemm.ok() ? std::move(*gemm) : std::unique_ptr<LtGemm>();
  const LtGemm* found =
      kept != nullptr && kept->beats_baseline() ? kept.get() : nullptr;
  lt_gemms_.emplace(key, std::move(kept));
  return found;
}

absl::Status NsWorkspace::SearchLeftMultiply() {
  left_searched_ = true;
  // Timed with R's fp32 scratch as the output: it holds count * m * m
  // floats, so count * m / n of the m x n outputs (none: cuBLAS runs).
  const int64_t timed = std::min(count_, count_ * m_ / n_);
  if (timed < 1) {
    dense_choice_ = "dense products on cuBLAS (too little scratch to time)";
    return absl::OkStatus();
  }
  MUONPS_RETURN_IF_ERROR(EnsureLt());
  const StackOperand w = Wide(x_low());
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = LtGemm::Search(
      lt_, baseline_handle_,
      LeftMultiplyShape(low_, CUDA_R_32F, count_, m_, n_, w),
      LeftMultiplyA(square_low(0), w), LeftMultiplyB(square_low(0), w),
      square32(1), lt_workspace_.get(), lt_workspace_.bytes(),
      /*candidates=*/24, timed);
  if (!gemm.ok()) {
    dense_choice_ = absl::StrCat(
        "dense products on cuBLAS (cuBLASLt: ", gemm.status().message(), ")");
    return absl::OkStatus();
  }
  const LtGemm::Trial& best = (*gemm)->trials()[(*gemm)->best()];
  dense_choice_ = absl::StrCat(
      "dense products on ",
      (*gemm)->beats_baseline()
          ? absl::StrCat("cuBLASLt tile ", best.tile, " cluster ", best.cluster)
          : "cuBLAS",
      " (", timed, " matrices: cuBLASLt ", absl::SixDigits(best.ms),
      " ms, cuBLAS ", absl::SixDigits((*gemm)->baseline_ms()), " ms)");
  if ((*gemm)->beats_baseline()) left_gemm_ = std::move(*gemm);
  return absl::OkStatus();
}

absl::Status NsWorkspace::AddTiles(const void* l, const StackOperand& lo,
                                   const void* r, const StackOperand& ro,
                                   float* c, int64_t k) {
  const SymmetricPlan run = EffectivePlan(plan_, m_);
  if (run.mode != SymmetricMode::kTiles &&
      run.mode != SymmetricMode::kLtTiles) {
    return absl::OkStatus();
  }
  const auto key = std::make_tuple(l, r, static_cast<const float*>(c));
  if (tiles_.count(key) > 0) return absl::OkStatus();
  MUONPS_ASSIGN_OR_RETURN(TilePointers tiles,
                          TilePointers::Build(lo, ro, c, ElementBytes(low_),
                                              count_, m_, run.blocks));
  if (run.mode == SymmetricMode::kLtTiles) {
    MUONPS_ASSIGN_OR_RETURN(const LtGemm* lt, LtFor(lo, ro, k, tiles));
    tiles.set_lt(lt);
  }
  tiles_.emplace(key, std::move(tiles));
  return absl::OkStatus();
}

absl::Status NsWorkspace::EnsureOperand(DeviceBuffer* buffer, size_t elements,
                                        const char* what) {
  const size_t had = buffer->bytes();
  MUONPS_RETURN_IF_ERROR(Ensure(buffer, elements * ElementBytes(low_), what));
  if (!timed_ || buffer->bytes() == had) return absl::OkStatus();
  // The searches time GEMMs on these buffers before any run fills them;
  // zeros would let a power-limited GPU clock higher than real data does
  // and favour other algorithms.
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      LaunchFillRandom(buffer->get(), static_cast<int64_t>(elements), low_,
                       static_cast<uint32_t>(elements), 1.0f, nullptr),
      "filling a Newton-Schulz operand for timing"));
  return CudaStatus(cudaStreamSynchronize(nullptr),
                    "filling a Newton-Schulz operand for timing");
}

absl::Status NsWorkspace::Prepare(NsAlgorithm algorithm) {
  const size_t wide = static_cast<size_t>(count_ * m_ * n_);
  const size_t square = static_cast<size_t>(count_ * m_ * m_);
  const bool gram = algorithm == NsAlgorithm::kGram;
  const int squares32 = gram ? 3 : 2;
  const int squares_low = gram ? 5 : 2;
  MUONPS_RETURN_IF_ERROR(EnsureOperand(&x_low_, wide, "iterate copy"));
  for (int i = 0; i < squares32; ++i) {
    MUONPS_RETURN_IF_ERROR(
        Ensure(&square32_[i], square * sizeof(float), "fp32 square"));
  }
  for (int i = 0; i < squares_low; ++i) {
    MUONPS_RETURN_IF_ERROR(
        EnsureOperand(&square_low_[i], square, "square copy"));
  }
  MUONPS_RETURN_IF_ERROR(
      Ensure(&sums_, static_cast<size_t>(count_) * sizeof(double), "norms"));
  MUONPS_RETURN_IF_ERROR(Ensure(
      &scales_, static_cast<size_t>(count_ * m_) * sizeof(float), "scales"));
  MUONPS_RETURN_IF_ERROR(
      Ensure(&unhealthy_, sizeof(unsigned int), "drift counter"));
  if (timed_ && !plan_chosen_) {
    MUONPS_RETURN_IF_ERROR(ChooseTilePlan(algorithm));
  }
  if (timed_ && !left_searched_) {
    MUONPS_RETURN_IF_ERROR(SearchLeftMultiply());
    // Once per shape, at its first use (never on the step path).
    spdlog::info("Newton-Schulz {} x {}x{}: {}; {}", count_,
                 row_major_ ? m_ : n_, row_major_ ? n_ : m_, tile_choice_,
                 dense_choice_);
  }
  return AddAllTiles(algorithm);
}

absl::Status NsWorkspace::AddAllTiles(NsAlgorithm algorithm) {
  const bool gram = algorithm == NsAlgorithm::kGram;
  // Every (l, r, c) triple the iterations multiply (see NsEngine).
  const auto sq = [this](int i) { return SquareStack(square_low(i), m_); };
  MUONPS_RETURN_IF_ERROR(AddTiles(x_low(), Wide(x_low()), x_low(),
                                  Wide(x_low()), square32(0), n_));
  MUONPS_RETURN_IF_ERROR(
      AddTiles(square_low(0), sq(0), square_low(0), sq(0), square32(1), m_));
  if (gram) {
    for (const int q : {2, 4}) {  // Q and its double buffer
      MUONPS_RETURN_IF_ERROR(AddTiles(square_low(1), sq(1), square_low(q),
                                      sq(q), square32(2), m_));
    }
    MUONPS_RETURN_IF_ERROR(
        AddTiles(square_low(1), sq(1), square_low(0), sq(0), square32(0), m_));
    MUONPS_RETURN_IF_ERROR(
        AddTiles(square_low(1), sq(1), square_low(3), sq(3), square32(0), m_));
  }
  return absl::OkStatus();
}

// Measured on the 56-matrix Llama set in bf16: on an H200 cuBLAS's 256-row
// tiles beat cuBLASLt's 512-row ones (156.9 against 159.3 ms, bench), on an
// H100 the reverse (163.4 against 165.3 ms); so each shape times both.
absl::Status NsWorkspace::ChooseTilePlan(NsAlgorithm algorithm) {
  plan_chosen_ = true;
  SymmetricPlan cublas = plan_;
  cublas.mode = SymmetricMode::kTiles;
  cublas.blocks = plan_.blocks * 2;
  if (EffectivePlan(cublas, m_).blocks == EffectivePlan(plan_, m_).blocks) {
    return absl::OkStatus();  // the same tiles: the Lt search compares
  }
  MUONPS_RETURN_IF_ERROR(EnsureLt());
  // Products per iteration: NS5 one X X^T per square one; Gram NS about 8
  // square ones per X X^T.
  const double square_weight = algorithm == NsAlgorithm::kGram ? 8.0 : 1.0;
  const StackOperand x = Wide(x_low());
  const StackOperand a = SquareStack(square_low(0), m_);
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<StreamTimer> timer,
                          StreamTimer::Create());
  const SymmetricPlan candidates[2] = {plan_, cublas};
  std::string timings;
  double best_ms = 0;
  SymmetricPlan best = plan_;
  // On any failure the workspace keeps its first plan, with no tiles built.
  const auto fail = [&](absl::Status status) {
    plan_ = candidates[0];
    tiles_.clear();
    return status;
  };
  for (const SymmetricPlan& candidate : candidates) {
    plan_ = candidate;
    tiles_.clear();
    absl::Status built = AddTiles(x_low(), x, x_low(), x, square32(0), n_);
    if (built.ok()) {
      built = AddTiles(square_low(0), a, square_low(0), a, square32(1), m_);
    }
    if (!built.ok()) return fail(built);
    const TilePointers* gram_tiles = Tiles(x_low(), x_low(), square32(0));
    const TilePointers* square_tiles =
        Tiles(square_low(0), square_low(0), square32(1));
    const auto product = [&](cudaStream_t stream, const StackOperand& op,
                             int64_t k, float* c, const TilePointers* tiles) {
      MUONPS_RETURN_IF_ERROR(CublasStatus(
          cublasSetStream(baseline_handle_, stream), "cublasSetStream"));
      return LowerProduct(baseline_handle_, plan_, low_, count_, m_, k, 1.0f,
                          op, op, 0.0f, c, tiles);
    };
    const absl::StatusOr<double> gram_ms =
        timer->MedianMs([&](cudaStream_t stream) {
          return product(stream, x, n_, square32(0), gram_tiles);
        });
    if (!gram_ms.ok()) return fail(gram_ms.status());
    const absl::StatusOr<double> square_ms =
        timer->MedianMs([&](cudaStream_t stream) {
          return product(stream, a, m_, square32(1), square_tiles);
        });
    if (!square_ms.ok()) return fail(square_ms.status());
    const double ms = *gram_ms + square_weight * *square_ms;
    absl::StrAppend(&timings, &candidate == &candidates[0] ? "" : ", ",
                    PlanName(candidate), " ", absl::SixDigits(ms), " ms");
    if (&candidate == &candidates[0] || ms < best_ms) {
      best_ms = ms;
      best = candidate;
    }
  }
  plan_ = best;
  tiles_.clear();
  tile_choice_ = absl::StrCat("symmetric products on ", PlanName(best), " (",
                              timings, ")");
  return absl::OkStatus();
}

const TilePointers* NsWorkspace::Tiles(const void* l, const void* r,
                                       const float* c) const {
  const auto it = tiles_.find(std::make_tuple(l, r, c));
  return it == tiles_.end() ? nullptr : &it->second;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
