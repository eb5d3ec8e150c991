#include "common/tensor_view.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace muonps {

std::vector<int64_t> ContiguousStrides(absl::Span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

absl::StatusOr<TensorView> TensorView::Create(
    void* data, DType dtype, absl::Span<const int64_t> shape,
    absl::Span<const int64_t> strides) {
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    return InvalidField(
        "shape", absl::StrCat("rank ", shape.size(), " exceeds ", kMaxRank));
  }
  if (!strides.empty() && strides.size() != shape.size()) {
    return InvalidField("strides",
                        absl::StrCat("has ", strides.size(),
                                     " entries but shape has ", shape.size()));
  }
  // `span` is the product of the dimensions with zeros counted as one: the
  // strides of a row-major layout reach it, so it must fit in int64 even
  // when a zero dimension makes the tensor empty. It is bounded so that
  // size_bytes() cannot overflow either.
  constexpr int64_t kMaxSpan = std::numeric_limits<int64_t>::max() / 8;
  int64_t count = 1;
  int64_t span = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return InvalidField(absl::StrCat("shape[", i, "]"),
                          absl::StrCat(shape[i], " is negative"));
    }
    const int64_t dim = std::max<int64_t>(shape[i], 1);
    if (span > kMaxSpan / dim) {
      return InvalidField("shape", "element count overflows int64");
    }
    span *= dim;
    count *= shape[i];
    if (!strides.empty() && strides[i] < 0) {
      return InvalidField(absl::StrCat("strides[", i, "]"),
                          absl::StrCat(strides[i], " is negative"));
    }
  }
  if (data == nullptr && count > 0) {
    return InvalidField("data", "is null but the tensor has elements");
  }
  TensorView view;
  view.data_ = data;
  view.dtype_ = dtype;
  view.shape_.assign(shape.begin(), shape.end());
  view.strides_ = strides.empty()
                      ? ContiguousStrides(shape)
                      : std::vector<int64_t>(strides.begin(), strides.end());
  view.num_elements_ = count;
  return view;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

std::string TensorView::DebugString() const {
  return absl::StrCat(DTypeName(dtype_), "[", absl::StrJoin(shape_, ", "), "]");
}

}  // namespace muonps
