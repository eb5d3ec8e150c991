#include "kernels/cpu/cpu_kernels.h"

#include <cblas.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace {

// torch.lerp's two-sided formula, which is exact at both ends:
// start + w (end - start) for w < 0.5, else end - (end - start) (1 - w).
inline float Lerp(float start, float end, float weight) {
  return weight < 0.5f ? start + weight * (end - start)
                       : end - (end - start) * (1.0f - weight);
}

// Index of the first non-finite element of [data, data + count), or -1.
int64_t FirstNonFinite(const float* data, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(data[i])) return i;
  }
  return -1;
}

}  // namespace

CpuKernels::CpuKernels(const CpuKernelOptions& options)
    : update_dtype_(options.update_dtype) {
  if (options.threads > 0) openblas_set_num_threads(options.threads);
}

absl::Status CpuKernels::CheckFinite(const MatrixStack& stack,
                                     absl::Span<const std::string> names,
                                     Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, backend_name()));
  MUONPS_RETURN_IF_ERROR(ValidateStack(stack, "grad"));
  for (int64_t i = 0; i < stack.count; ++i) {
    const int64_t bad =
        FirstNonFinite(stack.matrix(i), stack.matrix_elements());
    if (bad >= 0) {
      const float value = stack.matrix(i)[bad];
      return InvalidField(
          absl::StrCat("grad of matrix ", MatrixName(names, i)),
          absl::StrCat("element [", bad / stack.cols, ", ", bad % stack.cols,
                       "] is ", std::isnan(value) ? "NaN" : "Inf",
                       "; the step was rejected and nothing was written"));
    }
  }
  return absl::OkStatus();
}

absl::Status CpuKernels::UpdateMomentum(const MatrixStack& grad,
                                        const MatrixStack& previous,
                                        const MatrixStack& momentum, double mu,
                                        bool nesterov,
                                        const MatrixStack& update,
                                        Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, backend_name()));
  MUONPS_RETURN_IF_ERROR(
      ValidateMomentumArgs(grad, previous, momentum, update));
  const float keep = static_cast<float>(1.0 - mu);
  const float mu_f = static_cast<float>(mu);
  const int64_t count = grad.elements();
  const float* old = previous.data;
  float* buf = momentum.data;
  for (int64_t i = 0; i < count; ++i) {
    const float g = grad.data[i];
    buf[i] = Lerp(old[i], g, keep);
    update.data[i] = nesterov ? Lerp(g, buf[i], mu_f) : buf[i];
  }
  return absl::OkStatus();
}

absl::Status CpuKernels::Orthogonalize(const MatrixStack& in,
                                       const MatrixStack& out,
                                       const NewtonSchulzOptions& options,
                                       Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, backend_name()));
  MUONPS_RETURN_IF_ERROR(ValidateStack(in, "in"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(out, "out", &in));
  MUONPS_RETURN_IF_ERROR(ValidateNewtonSchulzOptions(options));
  for (int64_t i = 0; i < in.count; ++i) {
    cpu::Orthogonalize(in.matrix(i), in.rows, in.cols, options, out.matrix(i),
                       &workspace_);
  }
  return absl::OkStatus();
}

absl::Status CpuKernels::ApplyUpdate(const MatrixStack& param,
                                     const MatrixStack& update, double lr,
                                     double weight_decay,
                                     LrAdjustment adjustment, Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, backend_name()));
  MUONPS_RETURN_IF_ERROR(ValidateStack(param, "param"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(update, "update", &param));
  const float decay = static_cast<float>(1.0 - lr * weight_decay);
  const float step =
      static_cast<float>(-AdjustedLr(lr, adjustment, param.rows, param.cols));
  const int64_t count = param.elements();
  for (int64_t i = 0; i < count; ++i) {
    param.data[i] = param.data[i] * decay + step * update.data[i];
  }
  return absl::OkStatus();
}

absl::Status CpuKernels::MuonStep(const MuonStack& stack,
                                  const MuonHyperparameters& hyper,
                                  Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, backend_name()));
  MUONPS_RETURN_IF_ERROR(ValidateMuonStack(stack));
  MUONPS_RETURN_IF_ERROR(ValidateMuonHyperparameters(hyper));
  MUONPS_RETURN_IF_ERROR(CheckFinite(stack.grad, stack.names, stream));
  update_.resize(stack.grad.elements());
  const MatrixStack update{update_.data(), stack.grad.count, stack.grad.rows,
                           stack.grad.cols};
  MUONPS_RETURN_IF_ERROR(UpdateMomentum(stack.grad, stack.momentum,
                                        stack.momentum, hyper.momentum,
                                        hyper.nesterov, update, stream));
  MUONPS_RETURN_IF_ERROR(Orthogonalize(update, update, hyper.ns, stream));
  if (update_dtype_ != DType::kFloat32) {
    rounded_.resize(update_.size());
    FromFloat(update_dtype_, update_.data(), update_.size(), rounded_.data());
    ToFloat(update_dtype_, rounded_.data(), rounded_.size(), update_.data());
  }
  return ApplyUpdate(stack.param, update, hyper.lr, hyper.weight_decay,
                     hyper.lr_adjustment, stream);
}

absl::Status CpuKernels::AdamWStep(const AdamWTensor& t,
                                   const AdamWHyperparameters& hyper,
                                   int64_t step, Stream stream) {
  MUONPS_RETURN_IF_ERROR(ValidateHostStream(stream, backend_name()));
  MUONPS_RETURN_IF_ERROR(ValidateAdamWStep(t, hyper, step));
  const int64_t bad = FirstNonFinite(t.grad, t.size);
  if (bad >= 0) {
    return InvalidField(
        absl::StrCat("grad of tensor ", Quoted(t.name)),
        absl::StrCat("element ", bad, " is ",
                     std::isnan(t.grad[bad]) ? "NaN" : "Inf",
                     "; the step was rejected and nothing was written"));
  }
  // torch.optim.AdamW: decay, moments, bias-corrected step.
  const double bias1 = 1.0 - std::pow(hyper.beta1, static_cast<double>(step));
  const double bias2 = 1.0 - std::pow(hyper.beta2, static_cast<double>(step));
  const float decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
  const float keep1 = static_cast<float>(1.0 - hyper.beta1);
  const float beta2 = static_cast<float>(hyper.beta2);
  const float keep2 = static_cast<float>(1.0 - hyper.beta2);
  const float step_size = static_cast<float>(hyper.lr / bias1);
  const float bias2_sqrt = static_cast<float>(std::sqrt(bias2));
  const float eps = static_cast<float>(hyper.eps);
  for (int64_t i = 0; i < t.size; ++i) {
    const float g = t.grad[i];
    t.param[i] *= decay;
    t.exp_avg[i] = Lerp(t.exp_avg[i], g, keep1);
    t.exp_avg_sq[i] = t.exp_avg_sq[i] * beta2 + keep2 * (g * g);
    const float denom = std::sqrt(t.exp_avg_sq[i]) / bias2_sqrt + eps;
    t.param[i] -= step_size * (t.exp_avg[i] / denom);
  }
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace muonps
