#include "kernels/cuda/cuda_kernels.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/cublas_status.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/ns_engine.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

// cuBLAS's recommended workspace on Hopper; graph capture needs one set.
constexpr size_t kCublasWorkspaceBytes = 64 << 20;

// The symmetric-product plan Newton-Schulz runs with: lower-triangle tiles
// in one pointer-array batched GEMM, of 512 rows through cuBLASLt with a
// timed algorithm (lt_tiles; each shape then also times cuBLAS's 256-row
// tiles and keeps the faster, NsWorkspace::Prepare) or of 256 rows (16
// blocks at m = 4096; about 53% of a dense product's FLOPs) through cuBLAS.
// Measured on an H200 on the 56-matrix Llama-3-8B set in bf16: 168 ms for the
// latter, against 171 ms for 8 blocks, about 180 ms for 8 row blocks and 232 ms
// for dense products; on an H100 the cuBLASLt tiles of 512 rows 163.4 / 164.0
// ms against 165.3 / 166.3 ms (bench/results/2026-11-25-h100x1-ns-variants).
SymmetricPlan DefaultPlan(bool lt_tiles) {
  SymmetricPlan plan;
  plan.mode = lt_tiles ? SymmetricMode::kLtTiles : SymmetricMode::kTiles;
  plan.blocks = lt_tiles ? 8 : 16;
  plan.min_block_rows = 256;
  return plan;
}

// The GPU kernels index matrices of a stack by grid dimension and cuBLAS
// takes 32-bit sizes.
absl::Status ValidateGpuStack(const MatrixStack& stack,
                              absl::string_view field) {
  constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
  if (stack.count > 65535 || stack.rows > kMaxDim || stack.cols > kMaxDim) {
    return InvalidField(
        field,
        absl::StrCat("shape [", stack.count, ", ", stack.rows, ", ", stack.cols,
                     "]: the CUDA backend takes at most 65535 "
                     "matrices of at most 2^31 - 1 rows and columns"));
  }
  return absl::OkStatus();
}

absl::Status NonFiniteError(absl::string_view what, absl::string_view where,
                            absl::string_view kind) {
  return InvalidField(what, absl::StrCat("element ", where, " is ", kind,
                                         "; the step was rejected and "
                                         "nothing was written"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaKernels>> CudaKernels::Create(
    const CudaKernelsOptions& options) {
  if (options.device < 0) {
    return InvalidField("device",
                        absl::StrCat(options.device, " must be >= 0"));
  }
  int devices = 0;
  const cudaError_t found = cudaGetDeviceCount(&devices);
  if (found != cudaSuccess || devices == 0) {
    cudaGetLastError();  // clear the sticky-free error for later callers
    return FieldError(
        absl::StatusCode::kUnavailable, "device",
        absl::StrCat(
            "no usable CUDA GPU on this machine (",
            found != cudaSuccess ? cudaGetErrorString(found) : "no devices",
            "); the cuda backend needs one"));
  }
  if (options.device >= devices) {
    return InvalidField(
        "device", absl::StrCat(options.device, " is not below the ", devices,
                               " CUDA devices present"));
  }
  int major = 0, minor = 0;
  MUONPS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &major, cudaDevAttrComputeCapabilityMajor, options.device));
  MUONPS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(
      &minor, cudaDevAttrComputeCapabilityMinor, options.device));
  if (major < 9) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "device",
        absl::StrCat("CUDA device ", options.device, " has compute capability ",
                     major, ".", minor,
                     "; the cuda backend is built for 9.0 (Hopper) or newer"));
  }
  std::unique_ptr<CudaKernels> kernels(new CudaKernels(options));
  MUONPS_RETURN_IF_ERROR(kernels->Init(options));
  return kernels;
}

CudaKernels::CudaKernels(const CudaKernelsOptions& options)
    : device_(options.device), precision_(options.precision) {}

absl::Status CudaKernels::Init(const CudaKernelsOptions& options) {
  MUONPS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  MUONPS_CUBLAS_RETURN_IF_ERROR(cublasCreate(&cublas_));
  MUONPS_ASSIGN_OR_RETURN(
      cublas_workspace_,
      DeviceBuffer::Allocate(kCublasWorkspaceBytes, "the cuBLAS workspace"));
  MUONPS_ASSIGN_OR_RETURN(first_bad_,
                          DeviceBuffer::Allocate(sizeof(unsigned long long),
                                                 "the finite-check flag"));
  MUONPS_CUDA_RETURN_IF_ERROR(cudaHostAlloc(
      &host_first_bad_, sizeof(unsigned long long), cudaHostAllocDefault));
  // One lane: splitting stacks over two streams (NsEngine's lanes) measured
  // slower, 175 ms against 168 ms on the Llama set (H200).
  NsLane lane;
  lane.handle = cublas_;
  lane.workspace = cublas_workspace_.get();
  lane.workspace_bytes = cublas_workspace_.bytes();
  engine_ = std::make_unique<NsEngine>(
      std::vector<NsLane>{lane}, CudaDataType(update_dtype()),
      DefaultPlan(options.lt_tiles), options.use_graphs);
  return absl::OkStatus();
}

CudaKernels::~CudaKernels() {
  cudaSetDevice(device_);
  // Waits for the Newton-Schulz work still queued (the only work that can
  // still use this object's memory: every other call that does ends
  // synchronized).
  engine_.reset();
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (host_first_bad_ != nullptr) cudaFreeHost(host_first_bad_);
}

absl::Status CudaKernels::Enter(Stream stream) const {
  if (stream == kHostStream) {
    return InvalidField(
        "stream",
        absl::StrCat("the cuda kernels enqueue on a CUDA stream of "
                     "device ",
                     device_, "; kHostStream (null) names host memory"));
  }
  return CudaStatus(cudaSetDevice(device_),
                    absl::StrCat("cudaSetDevice(", device_, ")"));
}

absl::Status CudaKernels::Synchronize(Stream stream) {
  MUONPS_RETURN_IF_ERROR(Enter(stream));
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

absl::Status CudaKernels::QueueFiniteCheck(const float* data, int64_t count,
                                           Stream stream) {
  MUONPS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
      first_bad_.get(), 0xff, sizeof(unsigned long long), stream));
  MUONPS_CUDA_RETURN_IF_ERROR(LaunchFindNonFinite(
      data, count, first_bad_.as<unsigned long long>(), stream));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> CudaKernels::ReadFiniteCheck(Stream stream) {
  MUONPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_first_bad_, first_bad_.get(),
                                              sizeof(unsigned long long),
                                              cudaMemcpyDeviceToHost, stream));
  MUONPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  const unsigned long long first = *host_first_bad_;
  if (first >= static_cast<unsigned long long>(INT64_MAX)) return -1;
  return static_cast<int64_t>(first);
}

absl::StatusOr<std::string> CudaKernels::NonFiniteKind(const float* data,
                                                       int64_t index,
                                                       Stream stream) {
  float value = 0;
  MUONPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      &value, data + index, sizeof(value), cudaMemcpyDeviceToHost, stream));
  MUONPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return std::string(std::isnan(value) ? "NaN" : "Inf");
}

absl::Status CudaKernels::CheckFinite(const MatrixStack& stack,
                                      absl::Span<const std::string> names,
                                      Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateStack(stack, "grad"));
  MUONPS_RETURN_IF_ERROR(Enter(stream));
  MUONPS_RETURN_IF_ERROR(
      QueueFiniteCheck(stack.data, stack.elements(), stream));
  MUONPS_ASSIGN_OR_RETURN(const int64_t bad, ReadFiniteCheck(stream));
  if (bad < 0) return absl::OkStatus();
  const int64_t matrix = bad / stack.matrix_elements();
  const int64_t at = bad % stack.matrix_elements();
  MUONPS_ASSIGN_OR_RETURN(const std::string kind,
                          NonFiniteKind(stack.data, bad, stream));
  return NonFiniteError(
      absl::StrCat("grad of matrix ", MatrixName(names, matrix)),
      absl::StrCat("[", at / stack.cols, ", ", at % stack.cols, "]"), kind);
}

absl::Status CudaKernels::UpdateMomentum(const MatrixStack& grad,
                                         const MatrixStack& previous,
                                         const MatrixStack& momentum, double mu,
                                         bool nesterov,
                                         const MatrixStack& update,
                                         Stream stream) {
  MUONPS_RETURN_IF_ERROR(
      ValidateMomentumArgs(grad, previous, momentum, update));
  MUONPS_RETURN_IF_ERROR(Enter(stream));
  return CudaStatus(
      LaunchMomentum(grad.data, previous.data, momentum.data, update.data,
                     grad.elements(), mu, nesterov, stream),
      "momentum kernel");
}

absl::Status CudaKernels::Orthogonalize(const MatrixStack& in,
                                        const MatrixStack& out,
                                        const NewtonSchulzOptions& options,
                                        Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateStack(in, "in"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(out, "out", &in));
  MUONPS_RETURN_IF_ERROR(ValidateGpuStack(in, "in"));
  MUONPS_RETURN_IF_ERROR(ValidateNewtonSchulzOptions(options));
  MUONPS_RETURN_IF_ERROR(Enter(stream));
  return engine_->Run(in.data, out.data, in.count, in.rows, in.cols, options,
                      stream);
}

absl::Status CudaKernels::ApplyUpdate(const MatrixStack& param,
                                      const MatrixStack& update, double lr,
                                      double weight_decay,
                                      LrAdjustment adjustment, Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateStack(param, "param"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(update, "update", &param));
  MUONPS_RETURN_IF_ERROR(Enter(stream));
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float step =
      static_cast<float>(-AdjustedLr(lr, adjustment, param.rows, param.cols));
  return CudaStatus(
      LaunchApplyUpdate(param.data, CUDA_R_32F, update.data, CUDA_R_32F,
                        param.elements(), decay, step, stream),
      "apply-update kernel");
}

DType CudaKernels::update_dtype() const { return PrecisionDType(precision_); }

absl::Status CudaKernels::MuonStep(const MuonStack& stack,
                                   const MuonHyperparameters& hyper,
                                   Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateMuonStack(stack));
  MUONPS_RETURN_IF_ERROR(ValidateGpuStack(stack.grad, "grad"));
  MUONPS_RETURN_IF_ERROR(ValidateMuonHyperparameters(hyper));
  MUONPS_RETURN_IF_ERROR(Enter(stream));
  const MatrixStack& grad = stack.grad;
  const int64_t elements = grad.elements();
  // The update in fp32, and rounded to the precision (16-bit) after it.
  const cudaDataType low = CudaDataType(update_dtype());
  const size_t wide_bytes = static_cast<size_t>(elements) * sizeof(float);
  const size_t bytes =
      wide_bytes +
      (low == CUDA_R_32F ? 0 : static_cast<size_t>(elements) * sizeof(short));
  if (update_.bytes() < bytes) {
    // Nothing queued uses the old buffer: every MuonStep ends synchronized.
    MUONPS_ASSIGN_OR_RETURN(update_,
                            DeviceBuffer::Allocate(bytes, "the Muon update"));
  }
  float* update = update_.as<float>();
  const unsigned long long* flag = first_bad_.as<unsigned long long>();
  MUONPS_RETURN_IF_ERROR(QueueFiniteCheck(grad.data, elements, stream));
  MUONPS_CUDA_RETURN_IF_ERROR(LaunchMomentum(
      grad.data, stack.momentum.data, stack.momentum.data, update, elements,
      hyper.momentum, hyper.nesterov, stream, flag));
  MUONPS_RETURN_IF_ERROR(engine_->Run(update, update, grad.count, grad.rows,
                                      grad.cols, hyper.ns, stream));
  const void* applied = update;
  if (low != CUDA_R_32F) {
    void* rounded = static_cast<char*>(update_.get()) + wide_bytes;
    MUONPS_CUDA_RETURN_IF_ERROR(
        LaunchConvert(update, CUDA_R_32F, rounded, low, elements, stream));
    applied = rounded;
  }
  const float decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
  const float step = static_cast<float>(
      -AdjustedLr(hyper.lr, hyper.lr_adjustment, grad.rows, grad.cols));
  MUONPS_CUDA_RETURN_IF_ERROR(LaunchApplyUpdate(stack.param.data, CUDA_R_32F,
                                                applied, low, elements, decay,
                                                step, stream, flag));
  MUONPS_ASSIGN_OR_RETURN(const int64_t bad, ReadFiniteCheck(stream));
  if (bad < 0) return absl::OkStatus();
  const int64_t matrix = bad / grad.matrix_elements();
  const int64_t at = bad % grad.matrix_elements();
  MUONPS_ASSIGN_OR_RETURN(const std::string kind,
                          NonFiniteKind(grad.data, bad, stream));
  return NonFiniteError(
      absl::StrCat("grad of matrix ", MatrixName(stack.names, matrix)),
      absl::StrCat("[", at / grad.cols, ", ", at % grad.cols, "]"), kind);
}

absl::Status CudaKernels::AdamWStep(const AdamWTensor& t,
                                    const AdamWHyperparameters& hyper,
                                    int64_t step, Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateAdamWStep(t, hyper, step));
  MUONPS_RETURN_IF_ERROR(Enter(stream));
  // torch.optim.AdamW's scalars, rounded to fp32 as the CPU backend does.
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(step));
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
  s.keep1 = static_cast<float>(1.0 - hyper.beta1);
  s.beta2 = static_cast<float>(hyper.beta2);
  s.keep2 = static_cast<float>(1.0 - hyper.beta2);
  s.step_size = static_cast<float>(hyper.lr / bias1);
  s.bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  s.eps = static_cast<float>(hyper.eps);
  const unsigned long long* flag = first_bad_.as<unsigned long long>();
  MUONPS_RETURN_IF_ERROR(QueueFiniteCheck(t.grad, t.size, stream));
  MUONPS_CUDA_RETURN_IF_ERROR(LaunchAdamW(
      t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.size, s, stream, flag));
  MUONPS_ASSIGN_OR_RETURN(const int64_t bad, ReadFiniteCheck(stream));
  if (bad < 0) return absl::OkStatus();
  MUONPS_ASSIGN_OR_RETURN(const std::string kind,
                          NonFiniteKind(t.grad, bad, stream));
  return NonFiniteError(absl::StrCat("grad of tensor ", Quoted(t.name)),
                        absl::StrCat(bad), kind);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
