#include "kernels/cuda/cuda_device_ops.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/precision.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

class CudaFloatBuffer final : public FloatBuffer {
 public:
  CudaFloatBuffer(DeviceBuffer buffer, int64_t count)
      : buffer_(std::move(buffer)), count_(count) {}
  float* data() const override { return buffer_.as<float>(); }
  int64_t size() const override { return count_; }

 private:
  DeviceBuffer buffer_;
  int64_t count_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaDeviceOps>> CudaDeviceOps::Create(
    int device, cudaStream_t stream) {
  int count = 0;
  MUONPS_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&count));
  if (device < 0 || device >= count) {
    return InvalidField("device", absl::StrCat("cuda:", device, " of ", count,
                                               " CUDA devices"));
  }
  MUONPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  bool owns = false;
  if (stream == nullptr) {
    MUONPS_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    owns = true;
  }
  std::unique_ptr<CudaDeviceOps> ops(new CudaDeviceOps(device, stream, owns));
  MUONPS_RETURN_IF_ERROR(ops->Init());
  return ops;
}

absl::Status CudaDeviceOps::Init() {
  MUONPS_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&compute_stream_, cudaStreamNonBlocking));
  return absl::OkStatus();
}

absl::StatusOr<int> CudaDeviceOps::Mark(Stream stream) {
  MUONPS_RETURN_IF_ERROR(UseDevice());
  if (marks_used_ == marks_.size()) {
    cudaEvent_t event = nullptr;
    MUONPS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
    marks_.push_back(event);
  }
  MUONPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(marks_[marks_used_], stream));
  return static_cast<int>(marks_used_++);
}

absl::Status CudaDeviceOps::WaitForMark(Stream waiter, int mark) {
  if (mark < 0 || static_cast<size_t>(mark) >= marks_used_) {
    return InvalidField("mark", absl::StrCat(mark, " of ", marks_used_));
  }
  MUONPS_RETURN_IF_ERROR(UseDevice());
  return CudaStatus(cudaStreamWaitEvent(waiter, marks_[mark], 0),
                    "cudaStreamWaitEvent");
}

absl::StatusOr<std::vector<double>> CudaDeviceOps::MarkTimesMs() {
  MUONPS_RETURN_IF_ERROR(UseDevice());
  std::vector<double> out;
  for (size_t i = 0; i < marks_used_; ++i) {
    MUONPS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(marks_[i]));
    float ms = 0;
    MUONPS_CUDA_RETURN_IF_ERROR(
        cudaEventElapsedTime(&ms, marks_[0], marks_[i]));
    out.push_back(ms);
  }
  return out;
}

CudaDeviceOps::~CudaDeviceOps() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (compute_stream_ != nullptr) {
    cudaStreamSynchronize(compute_stream_);
    cudaStreamDestroy(compute_stream_);
  }
  for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  if (host_flags_ != nullptr) cudaFreeHost(host_flags_);
  if (owns_stream_) cudaStreamDestroy(stream_);
}

absl::Status CudaDeviceOps::UseDevice() const {
  return CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
}

absl::StatusOr<std::unique_ptr<FloatBuffer>> CudaDeviceOps::Allocate(
    int64_t count, const char* what) {
  if (count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": negative size ", count));
  }
  MUONPS_RETURN_IF_ERROR(UseDevice());
  MUONPS_ASSIGN_OR_RETURN(
      DeviceBuffer buffer,
      DeviceBuffer::Allocate(static_cast<size_t>(count) * sizeof(float), what));
  return std::unique_ptr<FloatBuffer>(
      new CudaFloatBuffer(std::move(buffer), count));
}

absl::Status CudaDeviceOps::Copy(float* dst, const float* src, int64_t count,
                                 Stream stream) {
  if (count <= 0 || dst == src) return absl::OkStatus();
  MUONPS_RETURN_IF_ERROR(UseDevice());
  return CudaStatus(cudaMemcpyAsync(dst, src, count * sizeof(float),
                                    cudaMemcpyDefault, stream),
                    "cudaMemcpyAsync");
}

absl::Status CudaDeviceOps::CopyBytes(void* dst, const void* src, int64_t bytes,
                                      Stream stream) {
  if (bytes <= 0 || dst == src) return absl::OkStatus();
  MUONPS_RETURN_IF_ERROR(UseDevice());
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream),
                    "cudaMemcpyAsync");
}

absl::Status CudaDeviceOps::Scale(float* data, int64_t count, float factor,
                                  Stream stream) {
  MUONPS_RETURN_IF_ERROR(UseDevice());
  return CudaStatus(LaunchScale(data, count, factor, stream), "LaunchScale");
}

absl::Status CudaDeviceOps::ToFloat(float* dst, const void* src,
                                    DType src_dtype, int64_t count,
                                    Stream stream) {
  if (src_dtype == DType::kFloat32) {
    return Copy(dst, static_cast<const float*>(src), count, stream);
  }
  MUONPS_RETURN_IF_ERROR(UseDevice());
  return CudaStatus(LaunchConvert(src, CudaDataType(src_dtype), dst, CUDA_R_32F,
                                  count, stream),
                    "LaunchConvert");
}

absl::Status CudaDeviceOps::FromFloat(void* dst, DType dst_dtype,
                                      const float* src, int64_t count,
                                      Stream stream) {
  if (dst_dtype == DType::kFloat32) {
    return Copy(static_cast<float*>(dst), src, count, stream);
  }
  MUONPS_RETURN_IF_ERROR(UseDevice());
  return CudaStatus(LaunchConvert(src, CUDA_R_32F, dst, CudaDataType(dst_dtype),
                                  count, stream),
                    "LaunchConvert");
}

absl::Status CudaDeviceOps::ApplyScaled(void* param, DType param_dtype,
                                        const void* update, DType update_dtype,
                                        int64_t count, float decay, float step,
                                        Stream stream) {
  MUONPS_RETURN_IF_ERROR(CheckLentDType(param_dtype));
  MUONPS_RETURN_IF_ERROR(UseDevice());
  return CudaStatus(
      LaunchApplyUpdate(param, CudaDataType(param_dtype), update,
                        CudaDataType(update_dtype), count, decay, step, stream),
      "LaunchApplyUpdate");
}

absl::Status CudaDeviceOps::PrepareFiniteChecks(int64_t count, Stream stream) {
  if (count < 0) return absl::InvalidArgumentError("count: negative");
  MUONPS_RETURN_IF_ERROR(UseDevice());
  finite_count_ = count;
  if (count == 0) return absl::OkStatus();
  const size_t bytes = count * sizeof(unsigned long long);
  if (flags_.bytes() < bytes) {
    // Checks still queued on the old flags finish first.
    MUONPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    MUONPS_ASSIGN_OR_RETURN(flags_,
                            DeviceBuffer::Allocate(bytes, "finite flags"));
    if (host_flags_ != nullptr) cudaFreeHost(host_flags_);
    host_flags_ = nullptr;
    MUONPS_CUDA_RETURN_IF_ERROR(cudaMallocHost(&host_flags_, bytes));
  }
  MUONPS_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(flags_.as<unsigned long long>(), 0xFF, bytes, stream));
  return absl::OkStatus();
}

absl::Status CudaDeviceOps::CheckFinite(absl::Span<const FloatSpan> spans,
                                        int64_t first, Stream stream) {
  if (first < 0 || first + static_cast<int64_t>(spans.size()) > finite_count_) {
    return absl::OutOfRangeError(
        absl::StrCat("spans [", first, ", ", first + spans.size(),
                     ") past the ", finite_count_, " prepared"));
  }
  MUONPS_RETURN_IF_ERROR(UseDevice());
  unsigned long long* flags = flags_.as<unsigned long long>() + first;
  for (size_t k = 0; k < spans.size(); ++k) {
    MUONPS_CUDA_RETURN_IF_ERROR(
        LaunchFindNonFinite(spans[k].data, spans[k].count, flags + k, stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> CudaDeviceOps::FiniteResults(
    int64_t count, Stream stream) {
  if (count < 0 || count > finite_count_) {
    return absl::OutOfRangeError(
        absl::StrCat("count: ", count, " of the ", finite_count_, " prepared"));
  }
  std::vector<int64_t> out(count, -1);
  if (count == 0) return out;
  MUONPS_RETURN_IF_ERROR(UseDevice());
  const size_t bytes = count * sizeof(unsigned long long);
  MUONPS_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_flags_, flags_.as<unsigned long long>(), bytes,
                      cudaMemcpyDeviceToHost, stream));
  MUONPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  for (int64_t k = 0; k < count; ++k) {
    if (host_flags_[k] < static_cast<unsigned long long>(INT64_MAX)) {
      out[k] = static_cast<int64_t>(host_flags_[k]);
    }
  }
  return out;
}

absl::Status CudaDeviceOps::Synchronize(Stream stream) {
  MUONPS_RETURN_IF_ERROR(UseDevice());
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
