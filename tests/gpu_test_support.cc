#include "tests/gpu_test_support.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/cuda_device_ops.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_buffer.h"

namespace muonps {
namespace testing {
namespace {

using kernels::cuda::DeviceBuffer;

}  // namespace

const std::vector<MatrixCase>& Matrices() {
  static const auto* m = new std::vector<MatrixCase>{
      {"attn.q", 256, 256, 1}, {"attn.k", 256, 256, 1},
      {"mlp.up", 512, 256, 1}, {"mlp.down", 256, 512, 1},
      {"proj", 384, 128, 1},   {"experts", 128, 256, 3}};
  return *m;
}

absl::Status UploadAs(DType dtype, const std::vector<float>& values,
                      void* device) {
  std::vector<char> narrow(values.size() * DTypeSize(dtype));
  FromFloat(dtype, values.data(), values.size(), narrow.data());
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(device, narrow.data(), narrow.size(), cudaMemcpyHostToDevice),
      "upload"));
  return CudaStatus(cudaDeviceSynchronize(), "upload (landing)");
}

absl::StatusOr<std::vector<float>> DownloadAs(DType dtype, const void* device,
                                              int64_t count) {
  std::vector<char> narrow(count * DTypeSize(dtype));
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpy(narrow.data(), device, narrow.size(), cudaMemcpyDeviceToHost),
      "download"));
  std::vector<float> out(count);
  ToFloat(dtype, narrow.data(), count, out.data());
  return out;
}

absl::Status ReferenceStep(kernels::MuonKernels& kernels,
                           kernels::DeviceOps& ops,
                           const kernels::MatrixStack& grad,
                           const kernels::MatrixStack& momentum, void* param,
                           DType dtype, const kernels::MuonHyperparameters& h,
                           Stream stream) {
  if (dtype == DType::kFloat32) {
    kernels::MuonStack stack;
    stack.names = {"reference"};
    stack.grad = grad;
    stack.momentum = momentum;
    stack.param = {static_cast<float*>(param), grad.count, grad.rows,
                   grad.cols};
    return kernels.MuonStep(stack, h, stream);
  }
  absl::Status s = kernels.UpdateMomentum(grad, momentum, momentum, h.momentum,
                                          h.nesterov, grad, stream);
  if (s.ok()) s = kernels.Orthogonalize(grad, grad, h.ns, stream);
  // The update is Newton-Schulz's result rounded to its precision.
  const DType update_dtype = kernels.update_dtype();
  absl::StatusOr<kernels::TypedBuffer> update = kernels::TypedBuffer::Allocate(
      ops, update_dtype, grad.elements(), "reference update");
  if (s.ok()) s = update.status();
  if (s.ok()) {
    s = ops.FromFloat(update->at(0), update_dtype, grad.data, grad.elements(),
                      stream);
  }
  if (s.ok()) {
    s = ops.ApplyScaled(param, dtype, update->at(0), update_dtype,
                        grad.elements(),
                        static_cast<float>(1.0 - h.lr * h.weight_decay),
                        static_cast<float>(-kernels::AdjustedLr(
                            h.lr, h.lr_adjustment, grad.rows, grad.cols)),
                        stream);
  }
  if (s.ok()) s = ops.Synchronize(stream);
  return s;
}

float GradValue(int64_t step, int matrix, int64_t i) {
  // Deterministic, varied magnitude and sign.
  const uint64_t x = (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull) ^
                     (static_cast<uint64_t>(matrix) << 40) ^
                     static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull;
  const uint64_t y = (x ^ (x >> 31)) * 0x94D049BB133111EBull;
  return static_cast<float>(static_cast<double>(y >> 11) / 9007199254740992.0 -
                            0.5) *
         (1.0f + static_cast<float>(matrix % 3));
}

float AsLent(DType dtype, float v) {
  return dtype == DType::kFloat32 ? v : BFloat16ToFloat(FloatToBFloat16(v));
}

absl::StatusOr<std::vector<std::vector<float>>> ReferenceParams(
    DType dtype, int steps,
    const std::map<std::string, NsAlgorithm>& algorithms,
    const std::function<float(size_t m, int64_t i)>& initial,
    const std::function<float(int64_t step, size_t m, int64_t i)>& grad) {
  absl::StatusOr<std::unique_ptr<kernels::cuda::CudaKernels>> reference =
      kernels::cuda::CudaKernels::Create({.device = 0});
  if (!reference.ok()) return reference.status();
  // Blocking: ordered with the cudaMemcpy calls below (legacy stream).
  cudaStream_t stream = nullptr;
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreate(&stream), "cudaStreamCreate"));
  const std::unique_ptr<CUstream_st, decltype(&cudaStreamDestroy)> stream_owner(
      stream, &cudaStreamDestroy);
  // bf16 parameters: the update is applied with the workers' own DeviceOps
  // (fp32 arithmetic, one rounding).
  absl::StatusOr<std::unique_ptr<kernels::cuda::CudaDeviceOps>> ops =
      kernels::cuda::CudaDeviceOps::Create(0, stream);
  if (!ops.ok()) return ops.status();
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype));
  std::vector<std::vector<float>> params;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixCase& c = Matrices()[m];
    const auto algorithm = algorithms.find(c.name);
    if (algorithm == algorithms.end()) {
      return absl::NotFoundError(
          absl::StrCat("matrix ", c.name, ": no NS algorithm"));
    }
    const int64_t n = c.rows * c.cols * c.experts;
    MUONPS_ASSIGN_OR_RETURN(DeviceBuffer grad_buffer,
                            DeviceBuffer::Allocate(n * sizeof(float), c.name));
    MUONPS_ASSIGN_OR_RETURN(DeviceBuffer momentum,
                            DeviceBuffer::Allocate(n * sizeof(float), c.name));
    MUONPS_ASSIGN_OR_RETURN(DeviceBuffer param,
                            DeviceBuffer::Allocate(n * width, c.name));
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaMemset(momentum.get(), 0, n * sizeof(float)),
                   absl::StrCat("cudaMemset of ", c.name)));
    std::vector<float> values(n);
    for (int64_t i = 0; i < n; ++i) values[i] = initial(m, i);
    MUONPS_RETURN_IF_ERROR(
        Annotate(UploadAs(dtype, values, param.get()), c.name));
    kernels::MuonHyperparameters h;
    h.lr = 0.02;
    h.weight_decay = 0.1;
    h.ns.algorithm = algorithm->second;
    const kernels::MatrixStack g{grad_buffer.as<float>(), c.experts, c.rows,
                                 c.cols};
    const kernels::MatrixStack mo{momentum.as<float>(), c.experts, c.rows,
                                  c.cols};
    for (int64_t step = 0; step < steps; ++step) {
      const std::string where = absl::StrCat(c.name, " step ", step);
      for (int64_t i = 0; i < n; ++i) values[i] = grad(step, m, i);
      MUONPS_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy(g.data, values.data(), n * sizeof(float),
                                cudaMemcpyHostToDevice),
                     absl::StrCat(where, ": gradient upload")));
      MUONPS_RETURN_IF_ERROR(
          Annotate(ReferenceStep(**reference, **ops, g, mo, param.get(), dtype,
                                 h, reinterpret_cast<Stream>(stream)),
                   where));
    }
    absl::StatusOr<std::vector<float>> reached =
        DownloadAs(dtype, param.get(), n);
    if (!reached.ok()) return Annotate(reached.status(), c.name);
    params.push_back(*std::move(reached));
  }
  return params;
}

std::vector<float> ExpertRows(const std::vector<float>& full,
                              const MatrixCase& c, int64_t b, int64_t e) {
  std::vector<float> rows;
  rows.reserve((e - b) * c.cols * c.experts);
  for (int64_t ex = 0; ex < c.experts; ++ex) {
    rows.insert(rows.end(), full.begin() + ex * c.rows * c.cols + b * c.cols,
                full.begin() + ex * c.rows * c.cols + e * c.cols);
  }
  return rows;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff +=
        (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-30));
}

std::vector<std::string> OwnNcclHostEnvironment(const std::string& name) {
  return {absl::StrCat("NCCL_HOSTID=muonps-", name, "-", getpid()),
          "NCCL_SOCKET_IFNAME=lo"};
}

}  // namespace testing
}  // namespace muonps
