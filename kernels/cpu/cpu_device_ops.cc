#include "kernels/cpu/cpu_device_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace kernels {
namespace {

class HostBuffer final : public FloatBuffer {
 public:
  explicit HostBuffer(std::vector<float> values) : values_(std::move(values)) {}
  float* data() const override { return const_cast<float*>(values_.data()); }
  int64_t size() const override { return static_cast<int64_t>(values_.size()); }

 private:
  std::vector<float> values_;
};

absl::Status HostOnly(Stream stream) {
  if (stream == kHostStream) return absl::OkStatus();
  return absl::InvalidArgumentError(
      "CPU device ops run on host memory: stream must be kHostStream");
}

}  // namespace

absl::StatusOr<std::unique_ptr<FloatBuffer>> CpuDeviceOps::Allocate(
    int64_t count, const char* what) {
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": negative size ", count));
  }
  std::vector<float> values;
  try {
    values.assign(static_cast<size_t>(count), 0.0f);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": cannot allocate ", count * 4, " bytes"));
  }
  return std::unique_ptr<FloatBuffer>(new HostBuffer(std::move(values)));
}

absl::Status CpuDeviceOps::Copy(float* dst, const float* src, int64_t count,
                                Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  if (count > 0 && dst != src) std::memcpy(dst, src, count * sizeof(float));
  return absl::OkStatus();
}

absl::Status CpuDeviceOps::CopyBytes(void* dst, const void* src, int64_t bytes,
                                     Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDeviceOps::Scale(float* data, int64_t count, float factor,
                                 Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  for (int64_t i = 0; i < count; ++i) data[i] *= factor;
  return absl::OkStatus();
}

absl::Status CpuDeviceOps::ToFloat(float* dst, const void* src, DType src_dtype,
                                   int64_t count, Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  if (count > 0) muonps::ToFloat(src_dtype, src, count, dst);
  return absl::OkStatus();
}

absl::Status CpuDeviceOps::FromFloat(void* dst, DType dst_dtype,
                                     const float* src, int64_t count,
                                     Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  if (count > 0) muonps::FromFloat(dst_dtype, src, count, dst);
  return absl::OkStatus();
}

absl::Status CpuDeviceOps::ApplyScaled(void* param, DType param_dtype,
                                       const void* update, DType update_dtype,
                                       int64_t count, float decay, float step,
                                       Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  if (absl::Status s = CheckLentDType(param_dtype); !s.ok()) return s;
  // Widened a block at a time (the update's element type is the step's,
  // the parameter's the trainer's).
  constexpr int64_t kBlock = 4096;
  float widened[kBlock];
  for (int64_t at = 0; at < count; at += kBlock) {
    const int64_t n = std::min(kBlock, count - at);
    const float* u = widened;
    if (update_dtype == DType::kFloat32) {
      u = static_cast<const float*>(update) + at;
    } else {
      muonps::ToFloat(update_dtype, ElementsPast(update, update_dtype, at), n,
                      widened);
    }
    if (param_dtype == DType::kFloat32) {
      float* p = static_cast<float*>(param) + at;
      for (int64_t i = 0; i < n; ++i) p[i] = p[i] * decay + step * u[i];
      continue;
    }
    uint16_t* p = static_cast<uint16_t*>(param) + at;
    for (int64_t i = 0; i < n; ++i) {
      p[i] = FloatToBFloat16(BFloat16ToFloat(p[i]) * decay + step * u[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuDeviceOps::PrepareFiniteChecks(int64_t count, Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  if (count < 0) return absl::InvalidArgumentError("count: negative");
  finite_.assign(count, -1);
  return absl::OkStatus();
}

absl::Status CpuDeviceOps::CheckFinite(absl::Span<const FloatSpan> spans,
                                       int64_t first, Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  if (first < 0 || first + static_cast<int64_t>(spans.size()) >
                       static_cast<int64_t>(finite_.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("spans [", first, ", ", first + spans.size(),
                     ") past the ", finite_.size(), " prepared"));
  }
  for (size_t k = 0; k < spans.size(); ++k) {
    for (int64_t i = 0; i < spans[k].count; ++i) {
      if (!std::isfinite(spans[k].data[i])) {
        finite_[first + k] = i;
        break;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CpuDeviceOps::FiniteResults(
    int64_t count, Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  if (count < 0 || count > static_cast<int64_t>(finite_.size())) {
    return absl::OutOfRangeError(absl::StrCat("count: ", count, " of the ",
                                              finite_.size(), " prepared"));
  }
  return std::vector<int64_t>(finite_.begin(), finite_.begin() + count);
}

absl::StatusOr<int> CpuDeviceOps::Mark(Stream stream) {
  if (absl::Status s = HostOnly(stream); !s.ok()) return s;
  marks_.push_back(std::chrono::steady_clock::now());
  return static_cast<int>(marks_.size()) - 1;
}

absl::Status CpuDeviceOps::WaitForMark(Stream waiter, int mark) {
  if (absl::Status s = HostOnly(waiter); !s.ok()) return s;
  if (mark < 0 || mark >= static_cast<int>(marks_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("mark: ", mark, " of ", marks_.size(), " marks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> CpuDeviceOps::MarkTimesMs() {
  std::vector<double> out;
  for (const auto& t : marks_) {
    out.push_back(
        std::chrono::duration<double, std::milli>(t - marks_.front()).count());
  }
  return out;
}

absl::Status CpuDeviceOps::Synchronize(Stream stream) {
  return HostOnly(stream);
}

}  // namespace kernels
}  // namespace muonps
