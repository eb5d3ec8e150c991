// A non-owning view of a dense tensor in host or device memory: a pointer,
// an element type, a shape and strides (in elements).
//
// A TensorView never owns or frees its memory; whoever lends the buffer keeps
// it alive while views of it are in use. Views are cheap to copy and are
// immutable after creation, so they are safe to share between threads (the
// memory they point to is not protected by them).
#ifndef MUONPS_COMMON_TENSOR_VIEW_H_
#define MUONPS_COMMON_TENSOR_VIEW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace muonps {

class TensorView {
 public:
  static constexpr int kMaxRank = 8;

  // Creates a view of `data`. Empty `strides` means row-major contiguous.
  // Fails with INVALID_ARGUMENT naming the field when the rank exceeds
  // kMaxRank, a dimension is negative, strides and shape differ in length,
  // a stride is negative, the element count overflows int64, or `data` is
  // null while the tensor has elements.
  static absl::StatusOr<TensorView> Create(
      void* data, DType dtype, absl::Span<const int64_t> shape,
      absl::Span<const int64_t> strides = {});

  TensorView() = default;

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[i]; }
  int64_t num_elements() const { return num_elements_; }

  // True when the elements are row-major with no gaps.
  bool is_contiguous() const;

  // Bytes spanned by the elements when contiguous.
  size_t size_bytes() const { return num_elements_ * DTypeSize(dtype_); }

  // Typed access for fp32 views; the caller checks dtype() first.
  float* float_data() const { return static_cast<float*>(data_); }

  // "fp32[64, 32]".
  std::string DebugString() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  int64_t num_elements_ = 0;
};

// Row-major strides for `shape`.
std::vector<int64_t> ContiguousStrides(absl::Span<const int64_t> shape);

}  // namespace muonps

#endif  // MUONPS_COMMON_TENSOR_VIEW_H_
