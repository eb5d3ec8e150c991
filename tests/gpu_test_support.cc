#include "tests/gpu_test_support.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace testing {

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
  const cudaError_t e =
      cudaMemcpy(device, narrow.data(), narrow.size(), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("upload: ", cudaGetErrorString(e)));
}

absl::StatusOr<std::vector<float>> DownloadAs(DType dtype, const void* device,
                                              int64_t count) {
  std::vector<char> narrow(count * DTypeSize(dtype));
  const cudaError_t e =
      cudaMemcpy(narrow.data(), device, narrow.size(), cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    return absl::InternalError(
        absl::StrCat("download: ", cudaGetErrorString(e)));
  }
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
  absl::Status s = kernels.UpdateMomentum(grad, momentum, h.momentum,
                                          h.nesterov, grad, stream);
  if (s.ok()) s = kernels.Orthogonalize(grad, grad, h.ns, stream);
  if (s.ok()) {
    s = ops.ApplyScaled(param, dtype, grad.data, grad.elements(),
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

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff +=
        (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    ref += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / std::max(ref, 1e-30));
}

}  // namespace testing
}  // namespace muonps
