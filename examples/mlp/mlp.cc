#include "examples/mlp/mlp.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "examples/mlp/counter_random.h"

namespace muonps {
namespace {

constexpr int64_t kMaxWidth = int64_t{1} << 20;
// Keeps the owned blocks at 8 GiB and every offset well inside int64.
constexpr int64_t kMaxBlockFloats = int64_t{1} << 31;
// batch * width must fit the 32-bit dimensions of LP64 OpenBLAS.
constexpr int64_t kMaxBatchElements = int64_t{1} << 31;

int64_t RoundUp(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

absl::StatusOr<Mlp> Mlp::Create(const MlpShape& shape) {
  const std::vector<int64_t>& widths = shape.widths;
  if (widths.size() < 2) {
    return InvalidField("widths",
                        absl::StrCat("has ", widths.size(),
                                     " entries: need an input and an output "
                                     "width at least"));
  }
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] < 1 || widths[i] > kMaxWidth) {
      return InvalidField(
          absl::StrCat("widths[", i, "]"),
          absl::StrCat(widths[i], " is outside [1, ", kMaxWidth, "]"));
    }
  }

  Mlp mlp;
  mlp.shape_ = shape;
  mlp.max_width_ = *std::max_element(widths.begin(), widths.end());
  int64_t next = 0;
  auto add = [&mlp, &next](std::string name, std::vector<int64_t> dims,
                           bool is_matrix) {
    MlpParameter parameter;
    parameter.name = std::move(name);
    parameter.num_elements = 1;
    for (int64_t d : dims) parameter.num_elements *= d;
    parameter.shape = std::move(dims);
    parameter.is_matrix = is_matrix;
    parameter.offset = RoundUp(next, kAlignmentFloats);
    next = parameter.offset + parameter.num_elements;
    mlp.num_parameters_ += parameter.num_elements;
    mlp.parameters_.push_back(std::move(parameter));
  };
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    add(absl::StrCat("layers.", l, ".weight"), {widths[l + 1], widths[l]},
        true);
    add(absl::StrCat("layers.", l, ".bias"), {widths[l + 1]}, false);
    if (next > kMaxBlockFloats) {
      return InvalidField("widths",
                          absl::StrCat("need more than ", kMaxBlockFloats,
                                       " floats of parameters"));
    }
  }
  mlp.block_floats_ = RoundUp(next, kAlignmentFloats);

  mlp.owned_params_.assign(mlp.block_floats_, 0.0f);
  mlp.owned_grads_.assign(mlp.block_floats_, 0.0f);
  mlp.params_ = mlp.owned_params_.data();
  mlp.grads_ = mlp.owned_grads_.data();
  mlp.hidden_.resize(widths.size() - 2);
  return mlp;
}

absl::Status Mlp::BindStorage(float* params, float* grads) {
  const auto check = [](absl::string_view field, const float* p) {
    if (p == nullptr) return InvalidField(field, "is null");
    if (reinterpret_cast<uintptr_t>(p) % alignof(float) != 0) {
      return InvalidField(field, "is not aligned to 4 bytes");
    }
    return absl::OkStatus();
  };
  MUONPS_RETURN_IF_ERROR(check("params", params));
  MUONPS_RETURN_IF_ERROR(check("grads", grads));
  const uintptr_t p = reinterpret_cast<uintptr_t>(params);
  const uintptr_t g = reinterpret_cast<uintptr_t>(grads);
  const uintptr_t bytes = static_cast<uintptr_t>(block_floats_) * sizeof(float);
  if (p < g + bytes && g < p + bytes) {
    return InvalidField("grads", absl::StrCat("overlaps params (blocks of ",
                                              bytes, " bytes each)"));
  }
  params_ = params;
  grads_ = grads;
  // The owned blocks are no longer used.
  std::vector<float>().swap(owned_params_);
  std::vector<float>().swap(owned_grads_);
  return absl::OkStatus();
}

const MlpParameter* Mlp::Find(absl::string_view name) const {
  for (const MlpParameter& parameter : parameters_) {
    if (parameter.name == name) return &parameter;
  }
  return nullptr;
}

absl::StatusOr<TensorView> Mlp::ParameterView(absl::string_view name) const {
  const MlpParameter* parameter = Find(name);
  if (parameter == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("parameter ", Quoted(name), ": no such tensor"));
  }
  return TensorView::Create(params_ + parameter->offset, DType::kFloat32,
                            parameter->shape);
}

absl::StatusOr<TensorView> Mlp::GradientView(absl::string_view name) const {
  const MlpParameter* parameter = Find(name);
  if (parameter == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("gradient ", Quoted(name), ": no such tensor"));
  }
  return TensorView::Create(grads_ + parameter->offset, DType::kFloat32,
                            parameter->shape);
}

void Mlp::Init(uint32_t seed, float scale) {
  for (size_t t = 0; t < parameters_.size(); ++t) {
    const MlpParameter& parameter = parameters_[t];
    // Weights and biases of a layer share its input width.
    const int64_t in = shape_.widths[t / 2];
    const float bound = scale / std::sqrt(static_cast<float>(in));
    float* values = params_ + parameter.offset;
    for (int64_t i = 0; i < parameter.num_elements; ++i) {
      values[i] = bound * mlp_random::UniformSymmetric(seed, t, i);
    }
    std::fill_n(grads_ + parameter.offset, parameter.num_elements, 0.0f);
  }
}

absl::Status Mlp::ValidateBatch(int64_t batch) const {
  if (batch < 1 || batch > kMaxBatchElements / max_width_) {
    return InvalidField("batch",
                        absl::StrCat(batch, " is outside [1, ",
                                     kMaxBatchElements / max_width_, "]"));
  }
  return absl::OkStatus();
}

void Mlp::ForwardInto(const float* x, int64_t batch, float* y) {
  const int layers = num_layers();
  const float* in = x;
  for (int l = 0; l < layers; ++l) {
    const int in_w = static_cast<int>(shape_.widths[l]);
    const int out_w = static_cast<int>(shape_.widths[l + 1]);
    const float* weight = params_ + parameters_[2 * l].offset;
    const float* bias = params_ + parameters_[2 * l + 1].offset;
    float* out = y;
    if (l + 1 < layers) {
      hidden_[l].resize(batch * out_w);
      out = hidden_[l].data();
    }
    for (int64_t i = 0; i < batch; ++i) {
      std::copy_n(bias, out_w, out + i * out_w);
    }
    // out[batch x out_w] += in[batch x in_w] * weight^T.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans,
                static_cast<int>(batch), out_w, in_w, 1.0f, in, in_w, weight,
                in_w, 1.0f, out, out_w);
    if (l + 1 < layers) {
      for (int64_t i = 0; i < batch * out_w; ++i) {
        out[i] = std::max(out[i], 0.0f);
      }
    }
    in = out;
  }
}

absl::Status Mlp::Forward(const float* x, int64_t batch, float* y) {
  if (x == nullptr) return InvalidField("x", "is null");
  if (y == nullptr) return InvalidField("y", "is null");
  MUONPS_RETURN_IF_ERROR(ValidateBatch(batch));
  ForwardInto(x, batch, y);
  return absl::OkStatus();
}

absl::StatusOr<double> Mlp::LossAndGrad(const float* x, const float* target,
                                        int64_t batch,
                                        int64_t loss_batch_scale) {
  if (x == nullptr) return InvalidField("x", "is null");
  if (target == nullptr) return InvalidField("target", "is null");
  MUONPS_RETURN_IF_ERROR(ValidateBatch(batch));
  if (loss_batch_scale < 1) {
    return InvalidField("loss_batch_scale",
                        absl::StrCat(loss_batch_scale, " must be >= 1"));
  }
  const int layers = num_layers();
  const int64_t out_width = output_width();
  output_.resize(batch * out_width);
  ForwardInto(x, batch, output_.data());

  // d loss / d y = 2 (y - target) / (loss_batch_scale * output_width).
  const double denominator =
      static_cast<double>(loss_batch_scale) * static_cast<double>(out_width);
  const float delta_scale = static_cast<float>(2.0 / denominator);
  double squared_error = 0.0;
  delta_.resize(batch * out_width);
  for (int64_t i = 0; i < batch * out_width; ++i) {
    const float diff = output_[i] - target[i];
    squared_error += static_cast<double>(diff) * diff;
    delta_[i] = diff * delta_scale;
  }

  // delta_ holds d loss / d (pre-activation output of layer l).
  for (int l = layers - 1; l >= 0; --l) {
    const int in_w = static_cast<int>(shape_.widths[l]);
    const int out_w = static_cast<int>(shape_.widths[l + 1]);
    const float* in = l == 0 ? x : hidden_[l - 1].data();
    const float* weight = params_ + parameters_[2 * l].offset;
    float* weight_grad = grads_ + parameters_[2 * l].offset;
    float* bias_grad = grads_ + parameters_[2 * l + 1].offset;

    // dW[out_w x in_w] = delta^T[out_w x batch] * in[batch x in_w].
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_w, in_w,
                static_cast<int>(batch), 1.0f, delta_.data(), out_w, in, in_w,
                0.0f, weight_grad, in_w);
    for (int j = 0; j < out_w; ++j) {
      double sum = 0.0;
      for (int64_t i = 0; i < batch; ++i) sum += delta_[i * out_w + j];
      bias_grad[j] = static_cast<float>(sum);
    }
    if (l == 0) break;

    // d in[batch x in_w] = delta[batch x out_w] * W[out_w x in_w], then
    // through the ReLU that produced `in` (its derivative at 0 is 0, as in
    // PyTorch; in > 0 exactly where the pre-activation was > 0).
    delta_next_.resize(batch * in_w);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans,
                static_cast<int>(batch), in_w, out_w, 1.0f, delta_.data(),
                out_w, weight, in_w, 0.0f, delta_next_.data(), in_w);
    for (int64_t i = 0; i < batch * in_w; ++i) {
      if (!(in[i] > 0.0f)) delta_next_[i] = 0.0f;
    }
    std::swap(delta_, delta_next_);
  }
  return squared_error / denominator;
}

}  // namespace muonps
