// A multi-layer perceptron with its own forward and backward pass, for the
// example trainer of the teacher-student task (no framework; OpenBLAS GEMMs).
//
// Layer l maps width[l] to width[l + 1]: h = W_l x + b_l, with W_l a
// width[l + 1] x width[l] row-major fp32 matrix (one of the matrices Muon
// optimizes) and b_l a vector (AdamW's). ReLU follows every layer but the
// last; the output has no activation. Parameters and gradients are named
// like PyTorch's state dict: "layers.<l>.weight", "layers.<l>.bias".
//
// Storage: all parameters live in one block of block_floats() floats, all
// gradients in a second block with the identical layout (see MlpParameter).
// The blocks are owned by the Mlp (zero-initialized) until BindStorage()
// points it at external memory, e.g. a SharedMemorySegment lent to a worker,
// which then reads gradients and writes updated parameters in place.
//
// Thread-safety: const methods may run concurrently. Forward, LossAndGrad,
// Init and BindStorage need external synchronization: the two passes use
// per-object scratch buffers. Results are bitwise deterministic for a given
// shape, batch, inputs and OpenBLAS thread count on one machine.
// Not copyable (a copy would alias bound storage); movable, and a moved-from
// Mlp may only be destroyed or assigned to.
#ifndef MUONPS_EXAMPLES_MLP_MLP_H_
#define MUONPS_EXAMPLES_MLP_MLP_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor_view.h"

namespace muonps {

struct MlpShape {
  // Input width, hidden widths, output width: {64, 256, 256, 32} is three
  // layers. At least two entries, each in [1, 2^20].
  std::vector<int64_t> widths;
};

// Where one parameter tensor sits in the parameter and gradient blocks.
struct MlpParameter {
  // "layers.<l>.weight" or "layers.<l>.bias".
  std::string name;
  // Weight: {out, in} (row-major); bias: {out}.
  std::vector<int64_t> shape;
  // True for weights (optimize with Muon), false for biases (AdamW).
  bool is_matrix = false;
  // First element in both blocks, in floats; a multiple of
  // Mlp::kAlignmentFloats.
  int64_t offset = 0;
  int64_t num_elements = 0;
};

class Mlp {
 public:
  // Tensors start on 64-byte boundaries of the block (given a 64-byte aligned
  // block), so workers updating different tensors in place never share a
  // cache line. The padding between tensors is never read or written.
  static constexpr int64_t kAlignmentFloats = 16;

  // Builds the layout for `shape` with owned, zero-filled storage.
  // INVALID_ARGUMENT naming "widths" (or "widths[i]") if there are fewer than
  // two widths or one is outside [1, 2^20].
  static absl::StatusOr<Mlp> Create(const MlpShape& shape);

  Mlp(Mlp&&) = default;
  Mlp& operator=(Mlp&&) = default;
  Mlp(const Mlp&) = delete;
  Mlp& operator=(const Mlp&) = delete;

  const MlpShape& shape() const { return shape_; }
  int num_layers() const { return static_cast<int>(shape_.widths.size()) - 1; }
  int64_t input_width() const { return shape_.widths.front(); }
  int64_t output_width() const { return shape_.widths.back(); }

  // Layout of the blocks, in this order: layers.0.weight, layers.0.bias,
  // layers.1.weight, ... Each tensor starts at the next multiple of
  // kAlignmentFloats after the previous one ends.
  const std::vector<MlpParameter>& parameters() const { return parameters_; }
  // Floats in each block, padding included (size a shared segment as
  // block_floats() * sizeof(float)).
  int64_t block_floats() const { return block_floats_; }
  // Floats that are parameters (padding excluded).
  int64_t num_parameters() const { return num_parameters_; }

  // Makes `params` and `grads` (block_floats() floats each, 4-byte aligned,
  // not overlapping) the model's storage from now on. Nothing is copied: the
  // parameters are whatever `params` holds, so bind, then Init() — or bind a
  // block another process already initialized. The caller keeps both blocks
  // alive for as long as the Mlp uses them. INVALID_ARGUMENT naming "params"
  // or "grads" for a null or misaligned pointer or overlapping blocks.
  absl::Status BindStorage(float* params, float* grads);

  float* params_data() { return params_; }
  const float* params_data() const { return params_; }
  float* grads_data() { return grads_; }
  const float* grads_data() const { return grads_; }

  // Views of one tensor in the current storage, for registering it with the
  // optimizer client. NOT_FOUND naming the tensor for an unknown name. The
  // views stay valid until the next BindStorage or the Mlp's destruction.
  absl::StatusOr<TensorView> ParameterView(absl::string_view name) const;
  absl::StatusOr<TensorView> GradientView(absl::string_view name) const;

  // Deterministic initialization, independent of the storage and of the
  // machine: every weight and bias element is drawn uniformly from
  // [-a, a), a = scale / sqrt(in) with `in` its layer's input width. scale 1
  // is PyTorch's nn.Linear default distribution; sqrt(6) gives He (Kaiming)
  // variance 2 / in. Gradients are zeroed.
  void Init(uint32_t seed, float scale);

  // y[batch x output_width] = the network applied to x[batch x input_width]
  // (both row-major). INVALID_ARGUMENT naming "x" or "y" when null, "batch"
  // when not in [1, 2^31 / max width).
  absl::Status Forward(const float* x, int64_t batch, float* y);

  // Forward and backward on x[batch x input_width] against
  // target[batch x output_width]. Overwrites (does not accumulate) every
  // gradient with the gradient of
  //
  //   loss = sum over the batch and outputs of (y - target)^2
  //          / (loss_batch_scale * output_width)
  //
  // and returns that loss. With loss_batch_scale == batch this is
  // torch.nn.functional.mse_loss (reduction "mean"). For R ranks holding
  // shards of one global batch of N samples:
  //  (a) DDP style: each passes loss_batch_scale = its own shard size. Its
  //      gradient (and loss) is that of the mean loss over its shard, and the
  //      MEAN over ranks equals the full-batch gradient when the shards are
  //      equal (N divisible by R) — what `replicated` after an all-reduce
  //      mean, or `unreduced` reduced with a mean, expects.
  //  (b) Partial-sum style: each passes loss_batch_scale = N. The gradients
  //      (and losses) SUM over ranks to the full-batch ones, for any split.
  // INVALID_ARGUMENT naming "x", "target", "batch" (as for Forward) or
  // "loss_batch_scale" (must be >= 1).
  absl::StatusOr<double> LossAndGrad(const float* x, const float* target,
                                     int64_t batch, int64_t loss_batch_scale);

 private:
  Mlp() = default;

  absl::Status ValidateBatch(int64_t batch) const;
  // Runs the layers on x, keeping every hidden activation in hidden_[l]
  // (post-ReLU, batch x widths[l + 1]); the output goes to y.
  void ForwardInto(const float* x, int64_t batch, float* y);
  const MlpParameter* Find(absl::string_view name) const;

  MlpShape shape_;
  std::vector<MlpParameter> parameters_;
  int64_t block_floats_ = 0;
  int64_t num_parameters_ = 0;
  int64_t max_width_ = 0;

  std::vector<float> owned_params_;
  std::vector<float> owned_grads_;
  float* params_ = nullptr;
  float* grads_ = nullptr;

  // Scratch for the passes, grown on demand.
  std::vector<std::vector<float>> hidden_;
  std::vector<float> output_;
  std::vector<float> delta_;
  std::vector<float> delta_next_;
};

}  // namespace muonps

#endif  // MUONPS_EXAMPLES_MLP_MLP_H_
