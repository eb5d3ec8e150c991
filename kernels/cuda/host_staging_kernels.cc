#include "kernels/cuda/host_staging_kernels.h"

#include <cuda_runtime.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace cuda {

absl::StatusOr<std::unique_ptr<HostStagingKernels>> HostStagingKernels::Create(
    const CudaKernelsOptions& options) {
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<CudaKernels> device,
                          CudaKernels::Create(options));
  // Create left the kernels' device current: the stream is made on it.
  cudaStream_t stream = nullptr;
  MUONPS_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::unique_ptr<HostStagingKernels>(
      new HostStagingKernels(std::move(device), stream));
}

HostStagingKernels::~HostStagingKernels() {
  // Every call ends synchronized, so nothing is left on the stream.
  cudaStreamDestroy(stream_);
}

absl::StatusOr<float*> HostStagingKernels::Upload(int slot, const float* data,
                                                  int64_t count) {
  if (static_cast<int>(slots_.size()) <= slot) slots_.resize(slot + 1);
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  DeviceBuffer& buffer = slots_[slot];
  if (buffer.bytes() < bytes) {
    // Grow-only: the old buffer is idle, every call here ends synchronized.
    MUONPS_ASSIGN_OR_RETURN(
        buffer, DeviceBuffer::Allocate(
                    bytes, absl::StrCat("host staging buffer ", slot)));
  }
  if (data != nullptr) {
    MUONPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        buffer.get(), data, bytes, cudaMemcpyHostToDevice, stream_));
  }
  return buffer.as<float>();
}

absl::StatusOr<MatrixStack> HostStagingKernels::UploadStack(
    int slot, const MatrixStack& host, bool copy) {
  MatrixStack device = host;
  if (host.data == nullptr || host.elements() <= 0) return device;
  MUONPS_ASSIGN_OR_RETURN(
      device.data, Upload(slot, copy ? host.data : nullptr, host.elements()));
  return device;
}

absl::Status HostStagingKernels::Download(const float* device, float* host,
                                          int64_t count) {
  return CudaStatus(
      cudaMemcpyAsync(host, device, static_cast<size_t>(count) * sizeof(float),
                      cudaMemcpyDeviceToHost, stream_),
      "copying results to the host");
}

absl::Status HostStagingKernels::CheckFinite(
    const MatrixStack& stack, absl::Span<const std::string> names,
    Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, "host-staging cuda"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(stack, "grad"));
  MUONPS_ASSIGN_OR_RETURN(const MatrixStack d, UploadStack(0, stack));
  return device_->CheckFinite(d, names, stream_);
}

absl::Status HostStagingKernels::UpdateMomentum(const MatrixStack& grad,
                                                const MatrixStack& previous,
                                                const MatrixStack& momentum,
                                                double mu, bool nesterov,
                                                const MatrixStack& update,
                                                Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, "host-staging cuda"));
  MUONPS_RETURN_IF_ERROR(
      ValidateMomentumArgs(grad, previous, momentum, update));
  MUONPS_ASSIGN_OR_RETURN(const MatrixStack g, UploadStack(0, grad));
  // The old momentum is uploaded into the slot the new one is computed in
  // (in place on the device), then downloaded to `momentum`.
  MUONPS_ASSIGN_OR_RETURN(const MatrixStack m, UploadStack(1, previous));
  MatrixStack u = g;
  if (update.data != grad.data) {
    MUONPS_ASSIGN_OR_RETURN(u, UploadStack(2, update, /*copy=*/false));
  }
  MUONPS_RETURN_IF_ERROR(
      device_->UpdateMomentum(g, m, m, mu, nesterov, u, stream_));
  MUONPS_RETURN_IF_ERROR(Download(m.data, momentum.data, m.elements()));
  MUONPS_RETURN_IF_ERROR(Download(u.data, update.data, u.elements()));
  return device_->Synchronize(stream_);
}

absl::Status HostStagingKernels::Orthogonalize(
    const MatrixStack& in, const MatrixStack& out,
    const NewtonSchulzOptions& options, Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, "host-staging cuda"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(in, "in"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(out, "out", &in));
  MUONPS_ASSIGN_OR_RETURN(const MatrixStack d_in, UploadStack(0, in));
  MatrixStack d_out = d_in;
  if (out.data != in.data) {
    MUONPS_ASSIGN_OR_RETURN(d_out, UploadStack(1, out, /*copy=*/false));
  }
  MUONPS_RETURN_IF_ERROR(device_->Orthogonalize(d_in, d_out, options, stream_));
  MUONPS_RETURN_IF_ERROR(Download(d_out.data, out.data, out.elements()));
  return device_->Synchronize(stream_);
}

absl::Status HostStagingKernels::ApplyUpdate(const MatrixStack& param,
                                             const MatrixStack& update,
                                             double lr, double weight_decay,
                                             LrAdjustment adjustment,
                                             Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, "host-staging cuda"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(param, "param"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(update, "update", &param));
  MUONPS_ASSIGN_OR_RETURN(const MatrixStack p, UploadStack(0, param));
  MUONPS_ASSIGN_OR_RETURN(const MatrixStack u, UploadStack(1, update));
  MUONPS_RETURN_IF_ERROR(
      device_->ApplyUpdate(p, u, lr, weight_decay, adjustment, stream_));
  MUONPS_RETURN_IF_ERROR(Download(p.data, param.data, p.elements()));
  return device_->Synchronize(stream_);
}

absl::Status HostStagingKernels::MuonStep(const MuonStack& stack,
                                          const MuonHyperparameters& hyper,
                                          Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, "host-staging cuda"));
  MUONPS_RETURN_IF_ERROR(ValidateMuonStack(stack));
  MuonStack d;
  d.names = stack.names;
  MUONPS_ASSIGN_OR_RETURN(d.grad, UploadStack(0, stack.grad));
  MUONPS_ASSIGN_OR_RETURN(d.momentum, UploadStack(1, stack.momentum));
  MUONPS_ASSIGN_OR_RETURN(d.param, UploadStack(2, stack.param));
  MUONPS_RETURN_IF_ERROR(device_->MuonStep(d, hyper, stream_));
  MUONPS_RETURN_IF_ERROR(
      Download(d.momentum.data, stack.momentum.data, d.momentum.elements()));
  MUONPS_RETURN_IF_ERROR(
      Download(d.param.data, stack.param.data, d.param.elements()));
  return device_->Synchronize(stream_);
}

absl::Status HostStagingKernels::AdamWStep(const AdamWTensor& t,
                                           const AdamWHyperparameters& hyper,
                                           int64_t step, Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, "host-staging cuda"));
  if (t.size <= 0 || t.param == nullptr || t.grad == nullptr ||
      t.exp_avg == nullptr || t.exp_avg_sq == nullptr) {
    // The device call says why.
    return device_->AdamWStep(t, hyper, step, stream_);
  }
  AdamWTensor d = t;
  MUONPS_ASSIGN_OR_RETURN(d.param, Upload(0, t.param, t.size));
  MUONPS_ASSIGN_OR_RETURN(float* grad, Upload(1, t.grad, t.size));
  d.grad = grad;
  MUONPS_ASSIGN_OR_RETURN(d.exp_avg, Upload(2, t.exp_avg, t.size));
  MUONPS_ASSIGN_OR_RETURN(d.exp_avg_sq, Upload(3, t.exp_avg_sq, t.size));
  MUONPS_RETURN_IF_ERROR(device_->AdamWStep(d, hyper, step, stream_));
  MUONPS_RETURN_IF_ERROR(Download(d.param, t.param, t.size));
  MUONPS_RETURN_IF_ERROR(Download(d.exp_avg, t.exp_avg, t.size));
  MUONPS_RETURN_IF_ERROR(Download(d.exp_avg_sq, t.exp_avg_sq, t.size));
  return device_->Synchronize(stream_);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
