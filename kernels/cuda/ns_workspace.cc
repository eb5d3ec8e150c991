#include "kernels/cuda/ns_workspace.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace cuda {

NsWorkspace::NsWorkspace(int64_t count, int64_t rows, int64_t cols,
                         cudaDataType low, const SymmetricPlan& plan)
    : count_(count),
      m_(std::min(rows, cols)),
      n_(std::max(rows, cols)),
      row_major_(rows <= cols),
      low_(low),
      plan_(plan) {}

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

absl::Status NsWorkspace::AddTiles(const void* l, const StackOperand& lo,
                                   const void* r, const StackOperand& ro,
                                   float* c) {
  const SymmetricPlan run = EffectivePlan(plan_, m_);
  if (run.mode != SymmetricMode::kTiles) return absl::OkStatus();
  const auto key = std::make_tuple(l, r, static_cast<const float*>(c));
  if (tiles_.count(key) > 0) return absl::OkStatus();
  MUONPS_ASSIGN_OR_RETURN(TilePointers tiles,
                          TilePointers::Build(lo, ro, c, ElementBytes(low_),
                                              count_, m_, run.blocks));
  tiles_.emplace(key, std::move(tiles));
  return absl::OkStatus();
}

absl::Status NsWorkspace::Prepare(NsAlgorithm algorithm) {
  const size_t low_bytes = ElementBytes(low_);
  const size_t wide = static_cast<size_t>(count_ * m_ * n_);
  const size_t square = static_cast<size_t>(count_ * m_ * m_);
  const bool gram = algorithm == NsAlgorithm::kGram;
  const int squares32 = gram ? 3 : 2;
  const int squares_low = gram ? 4 : 2;
  MUONPS_RETURN_IF_ERROR(Ensure(&x_low_, wide * low_bytes, "iterate copy"));
  for (int i = 0; i < squares32; ++i) {
    MUONPS_RETURN_IF_ERROR(
        Ensure(&square32_[i], square * sizeof(float), "fp32 square"));
  }
  for (int i = 0; i < squares_low; ++i) {
    MUONPS_RETURN_IF_ERROR(
        Ensure(&square_low_[i], square * low_bytes, "square copy"));
  }
  MUONPS_RETURN_IF_ERROR(
      Ensure(&sums_, static_cast<size_t>(count_) * sizeof(double), "norms"));
  MUONPS_RETURN_IF_ERROR(Ensure(
      &scales_, static_cast<size_t>(count_ * m_) * sizeof(float), "scales"));
  MUONPS_RETURN_IF_ERROR(
      Ensure(&unhealthy_, sizeof(unsigned int), "drift counter"));
  // Every (l, r, c) triple the iterations multiply (see NsEngine).
  const auto sq = [this](int i) { return SquareStack(square_low(i), m_); };
  MUONPS_RETURN_IF_ERROR(
      AddTiles(x_low(), Wide(x_low()), x_low(), Wide(x_low()), square32(0)));
  MUONPS_RETURN_IF_ERROR(
      AddTiles(square_low(0), sq(0), square_low(0), sq(0), square32(1)));
  if (gram) {
    MUONPS_RETURN_IF_ERROR(
        AddTiles(square_low(1), sq(1), square_low(2), sq(2), square32(2)));
    MUONPS_RETURN_IF_ERROR(
        AddTiles(square_low(1), sq(1), square_low(0), sq(0), square32(0)));
    MUONPS_RETURN_IF_ERROR(
        AddTiles(square_low(1), sq(1), square_low(3), sq(3), square32(0)));
  }
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
