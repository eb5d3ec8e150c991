#include "kernels/muon_kernels.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace {

bool Finite(double x) { return std::isfinite(x); }

absl::Status CheckNonNegative(double value, absl::string_view field) {
  if (!Finite(value) || value < 0) {
    return InvalidField(field, absl::StrCat(value, " must be finite and >= 0"));
  }
  return absl::OkStatus();
}

absl::Status CheckUnitInterval(double value, absl::string_view field) {
  if (!Finite(value) || value < 0 || value >= 1) {
    return InvalidField(field, absl::StrCat(value, " is not in [0, 1)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LrAdjustment> ParseLrAdjustment(absl::string_view name) {
  if (name == "original") return LrAdjustment::kOriginal;
  if (name == "match_rms_adamw") return LrAdjustment::kMatchRmsAdamW;
  return InvalidField(
      "adjust_lr_fn",
      absl::StrCat(Quoted(name), " is not one of original, match_rms_adamw"));
}

absl::string_view LrAdjustmentName(LrAdjustment adjustment) {
  return adjustment == LrAdjustment::kMatchRmsAdamW ? "match_rms_adamw"
                                                    : "original";
}

double AdjustedLr(double lr, LrAdjustment adjustment, int64_t rows,
                  int64_t cols) {
  const double r = static_cast<double>(rows);
  const double c = static_cast<double>(cols);
  if (adjustment == LrAdjustment::kMatchRmsAdamW) {
    return lr * 0.2 * std::sqrt(std::max(r, c));
  }
  return lr * std::sqrt(std::max(1.0, r / c));
}

absl::Status ValidateMuonHyperparameters(const MuonHyperparameters& h) {
  MUONPS_RETURN_IF_ERROR(CheckNonNegative(h.lr, "lr"));
  MUONPS_RETURN_IF_ERROR(CheckNonNegative(h.weight_decay, "weight_decay"));
  MUONPS_RETURN_IF_ERROR(CheckUnitInterval(h.momentum, "momentum"));
  return ValidateNewtonSchulzOptions(h.ns);
}

absl::Status ValidateAdamWHyperparameters(const AdamWHyperparameters& h) {
  MUONPS_RETURN_IF_ERROR(CheckNonNegative(h.lr, "lr"));
  MUONPS_RETURN_IF_ERROR(CheckUnitInterval(h.beta1, "betas[0]"));
  MUONPS_RETURN_IF_ERROR(CheckUnitInterval(h.beta2, "betas[1]"));
  if (!Finite(h.eps) || h.eps <= 0) {
    return InvalidField("eps", absl::StrCat(h.eps, " must be finite and > 0"));
  }
  return CheckNonNegative(h.weight_decay, "weight_decay");
}

std::string MatrixName(absl::Span<const std::string> names, int64_t i) {
  if (names.size() == 1) {
    return absl::StrCat(Quoted(names[0]), "[expert ", i, "]");
  }
  if (i < 0 || static_cast<size_t>(i) >= names.size()) {
    return absl::StrCat("matrix ", i);
  }
  return Quoted(names[i]);
}

absl::Status ValidateStack(const MatrixStack& stack, absl::string_view field,
                           const MatrixStack* like) {
  if (stack.count <= 0 || stack.rows <= 0 || stack.cols <= 0) {
    return InvalidField(
        field, absl::StrCat("shape [", stack.count, ", ", stack.rows, ", ",
                            stack.cols, "]: every dimension must be > 0"));
  }
  if (stack.data == nullptr) return InvalidField(field, "data is null");
  if (like != nullptr &&
      (stack.count != like->count || stack.rows != like->rows ||
       stack.cols != like->cols)) {
    return InvalidField(
        field, absl::StrCat("shape [", stack.count, ", ", stack.rows, ", ",
                            stack.cols, "] differs from [", like->count, ", ",
                            like->rows, ", ", like->cols, "]"));
  }
  return absl::OkStatus();
}

absl::Status ValidateMuonStack(const MuonStack& stack) {
  MUONPS_RETURN_IF_ERROR(ValidateStack(stack.grad, "grad"));
  MUONPS_RETURN_IF_ERROR(
      ValidateStack(stack.momentum, "momentum", &stack.grad));
  MUONPS_RETURN_IF_ERROR(ValidateStack(stack.param, "param", &stack.grad));
  if (stack.names.size() != 1 &&
      stack.names.size() != static_cast<size_t>(stack.grad.count)) {
    return InvalidField(
        "names", absl::StrCat("has ", stack.names.size(), " entries for ",
                              stack.grad.count,
                              " matrices (give one per matrix, or one "
                              "for an expert stack)"));
  }
  if (stack.momentum.data == stack.param.data ||
      stack.momentum.data == stack.grad.data) {
    return InvalidField("momentum", "must not alias grad or param");
  }
  return absl::OkStatus();
}

absl::Status ValidateMomentumArgs(const MatrixStack& grad,
                                  const MatrixStack& previous,
                                  const MatrixStack& momentum,
                                  const MatrixStack& update) {
  MUONPS_RETURN_IF_ERROR(ValidateStack(grad, "grad"));
  MUONPS_RETURN_IF_ERROR(ValidateStack(previous, "previous", &grad));
  MUONPS_RETURN_IF_ERROR(ValidateStack(momentum, "momentum", &grad));
  MUONPS_RETURN_IF_ERROR(ValidateStack(update, "update", &grad));
  if (momentum.data == update.data) {
    return InvalidField("update", "must not alias momentum");
  }
  if (previous.data == update.data) {
    return InvalidField("update", "must not alias previous");
  }
  return absl::OkStatus();
}

absl::Status ValidateHostStream(Stream stream, absl::string_view backend) {
  if (stream == kHostStream) return absl::OkStatus();
  return InvalidField("stream",
                      absl::StrCat("the ", backend,
                                   " kernels work on host memory and take "
                                   "kHostStream (null), not a device stream"));
}

absl::Status ValidateAdamWStep(const AdamWTensor& t,
                               const AdamWHyperparameters& hyper,
                               int64_t step) {
  MUONPS_RETURN_IF_ERROR(ValidateAdamWHyperparameters(hyper));
  if (t.size <= 0) {
    return InvalidField(absl::StrCat("size of tensor ", Quoted(t.name)),
                        absl::StrCat(t.size, " must be > 0"));
  }
  if (t.param == nullptr || t.grad == nullptr || t.exp_avg == nullptr ||
      t.exp_avg_sq == nullptr) {
    return InvalidField(absl::StrCat("tensor ", Quoted(t.name)),
                        "param, grad, exp_avg and exp_avg_sq must be set");
  }
  if (step < 1) {
    return InvalidField("step", absl::StrCat(step, " must be >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace kernels
}  // namespace muonps
