#include "kernels/device_ops.h"

#include "absl/strings/str_cat.h"

namespace muonps {
namespace kernels {

absl::Status CheckLentDType(DType dtype) {
  if (dtype == DType::kFloat32 || dtype == DType::kBFloat16) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype: ", DTypeName(dtype),
                   " is not supported; lend fp32 or bf16 tensors"));
}

absl::StatusOr<TypedBuffer> TypedBuffer::Allocate(DeviceOps& ops, DType dtype,
                                                  int64_t count,
                                                  const char* what) {
  const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
  TypedBuffer out;
  absl::StatusOr<std::unique_ptr<FloatBuffer>> block =
      ops.Allocate((bytes + 3) / 4, what);
  if (!block.ok()) return block.status();
  out.block_ = *std::move(block);
  out.dtype_ = dtype;
  out.size_ = count;
  return out;
}

absl::StatusOr<TypedBuffer> TypedBuffer::Wrap(
    std::unique_ptr<FloatBuffer> block, DType dtype, int64_t count) {
  const int64_t bytes = count * static_cast<int64_t>(DTypeSize(dtype));
  if (block == nullptr || count < 0 || block->size() * 4 < bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block: holds ", block == nullptr ? 0 : block->size() * 4,
        " bytes, not the ", bytes, " of ", count, " ", DTypeName(dtype)));
  }
  TypedBuffer out;
  out.block_ = std::move(block);
  out.dtype_ = dtype;
  out.size_ = count;
  return out;
}

}  // namespace kernels
}  // namespace muonps
