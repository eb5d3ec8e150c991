// The numeric kernels of a Muon step, behind one interface that every backend
// (CPU with OpenBLAS, CUDA with cuBLAS) implements.
//
// Kernels work on stacks of same-shape row-major fp32 matrices, so that one
// call runs a whole same-shape batch (a 3-D expert stack is such a batch).
// Semantics match torch.optim.Muon and torch.optim.AdamW exactly (see
// docs/architecture.md, "The update rule").
//
// Streams (NCCL's rule): every data-path call names the stream it is
// ordered on, enqueues its work there and returns; the work is done when
// the stream reaches it. UpdateMomentum, Orthogonalize and ApplyUpdate never
// wait. CheckFinite, MuonStep and AdamWStep return the device's finite check
// as their status, so they wait for `stream` before returning (everything
// queued on it before them is then done too). Host-memory backends take
// kHostStream and have finished when they return.
//
// A MuonKernels object is not safe for concurrent use: give each thread its
// own. Memory passed in stays owned by the caller and must stay valid until
// the call's work is done (until the stream reaches it).
#ifndef MUONPS_KERNELS_MUON_KERNELS_H_
#define MUONPS_KERNELS_MUON_KERNELS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/device.h"
#include "common/dtype.h"
#include "newton_schulz/options.h"

namespace muonps {
namespace kernels {

// How the learning rate is scaled by a matrix's shape (torch.optim.Muon's
// `adjust_lr_fn`).
enum class LrAdjustment {
  kOriginal,       // lr * sqrt(max(1, rows / cols))
  kMatchRmsAdamW,  // lr * 0.2 * sqrt(max(rows, cols))
};

// Parses "original" or "match_rms_adamw"; INVALID_ARGUMENT naming
// `adjust_lr_fn` otherwise.
absl::StatusOr<LrAdjustment> ParseLrAdjustment(absl::string_view name);
absl::string_view LrAdjustmentName(LrAdjustment adjustment);

// The learning rate torch.optim.Muon applies to a rows x cols matrix.
double AdjustedLr(double lr, LrAdjustment adjustment, int64_t rows,
                  int64_t cols);

struct MuonHyperparameters {
  double lr = 1e-3;
  double weight_decay = 0.1;
  double momentum = 0.95;
  bool nesterov = true;
  LrAdjustment lr_adjustment = LrAdjustment::kOriginal;
  NewtonSchulzOptions ns;
};

// INVALID_ARGUMENT naming the field unless lr >= 0, weight_decay >= 0,
// 0 <= momentum < 1 (all finite) and `ns` is valid.
absl::Status ValidateMuonHyperparameters(const MuonHyperparameters& h);

struct AdamWHyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// INVALID_ARGUMENT naming the field unless lr >= 0, 0 <= beta1, beta2 < 1,
// eps > 0 and weight_decay >= 0 (all finite).
absl::Status ValidateAdamWHyperparameters(const AdamWHyperparameters& h);

// `count` row-major rows x cols fp32 matrices stored back to back.
struct MatrixStack {
  float* data = nullptr;
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t matrix_elements() const { return rows * cols; }
  int64_t elements() const { return count * rows * cols; }
  float* matrix(int64_t i) const { return data + i * matrix_elements(); }
};

// What one Muon step reads and writes for a stack of same-shape matrices.
struct MuonStack {
  // One name per matrix, or a single name for a 3-D expert stack (messages
  // then say `name[expert i]`).
  std::vector<std::string> names;
  MatrixStack grad;      // read only
  MatrixStack momentum;  // fp32 momentum buffer, updated in place
  MatrixStack param;     // updated in place
};

// What one AdamW step reads and writes for one tensor (any shape, flat).
struct AdamWTensor {
  std::string name;
  float* param = nullptr;       // updated in place
  const float* grad = nullptr;  // read only
  float* exp_avg = nullptr;     // first moment, updated in place
  float* exp_avg_sq = nullptr;  // second moment, updated in place
  int64_t size = 0;
};

// Name of matrix `i` of a stack for messages: names[i], or
// names[0] + "[expert i]" for a single-name expert stack.
std::string MatrixName(absl::Span<const std::string> names, int64_t i);

class MuonKernels {
 public:
  MuonKernels() = default;
  MuonKernels(const MuonKernels&) = delete;
  MuonKernels& operator=(const MuonKernels&) = delete;
  virtual ~MuonKernels() = default;

  // "cpu" or "cuda".
  virtual absl::string_view backend_name() const = 0;

  // The precision Newton-Schulz iterates in: a step's update is
  // Orthogonalize's result rounded to it (nearest even), as
  // torch.optim.Muon's update is the bf16 result of its bf16 iteration.
  // MuonStep applies it so; a worker moves updates in it.
  virtual DType update_dtype() const = 0;

  // OK if every element of `stack` is finite; otherwise INVALID_ARGUMENT
  // naming the first offending matrix (see MatrixName) and element. Waits
  // for `stream`.
  virtual absl::Status CheckFinite(const MatrixStack& stack,
                                   absl::Span<const std::string> names,
                                   Stream stream) = 0;

  // momentum <- previous + (1 - mu) * (grad - previous); then
  // update <- nesterov ? grad + mu * (momentum - grad) : momentum.
  // `previous` is the momentum before this step: `momentum` itself (in
  // place), or another buffer, left as it is (a step that may still be
  // abandoned keeps its old momentum without a copy). `update` may alias
  // `grad` but neither momentum buffer. Enqueues on `stream`.
  virtual absl::Status UpdateMomentum(const MatrixStack& grad,
                                      const MatrixStack& previous,
                                      const MatrixStack& momentum, double mu,
                                      bool nesterov, const MatrixStack& update,
                                      Stream stream) = 0;

  // out_i <- NS(in_i) for every matrix of the stack; `out` may alias `in`.
  // Fails with INVALID_ARGUMENT for invalid `options` or mismatched shapes.
  // Enqueues on `stream`.
  virtual absl::Status Orthogonalize(const MatrixStack& in,
                                     const MatrixStack& out,
                                     const NewtonSchulzOptions& options,
                                     Stream stream) = 0;

  // param <- param * (1 - lr * weight_decay) - adjusted_lr * update, with
  // adjusted_lr from AdjustedLr for the stack's shape. Enqueues on `stream`.
  virtual absl::Status ApplyUpdate(const MatrixStack& param,
                                   const MatrixStack& update, double lr,
                                   double weight_decay, LrAdjustment adjustment,
                                   Stream stream) = 0;

  // One full Muon step on a stack: finite check of the gradients, momentum,
  // Newton-Schulz, weight decay and the scaled update (Orthogonalize's
  // result rounded to update_dtype()). On any error nothing
  // is written (the momentum and params are unchanged). Waits for `stream`.
  virtual absl::Status MuonStep(const MuonStack& stack,
                                const MuonHyperparameters& hyper,
                                Stream stream) = 0;

  // One torch.optim.AdamW step; `step` counts steps including this one
  // (>= 1) and sets the bias corrections. A non-finite gradient fails with
  // INVALID_ARGUMENT naming the tensor and writes nothing. Waits for
  // `stream`.
  virtual absl::Status AdamWStep(const AdamWTensor& tensor,
                                 const AdamWHyperparameters& hyper,
                                 int64_t step, Stream stream) = 0;
};

// INVALID_ARGUMENT naming `field` unless the stack is non-empty in every
// dimension, has data, and (when `like` is given) matches its shape.
absl::Status ValidateStack(const MatrixStack& stack, absl::string_view field,
                           const MatrixStack* like = nullptr);

// Validates a MuonStack: names, three stacks of one shape, momentum and
// param distinct buffers.
absl::Status ValidateMuonStack(const MuonStack& stack);

// Validates UpdateMomentum's stacks: grad valid, previous, momentum and
// update of its shape, update aliasing neither momentum buffer.
absl::Status ValidateMomentumArgs(const MatrixStack& grad,
                                  const MatrixStack& previous,
                                  const MatrixStack& momentum,
                                  const MatrixStack& update);

// INVALID_ARGUMENT naming `stream` unless it is kHostStream: what backends
// that work on host memory (and finish before returning) accept.
absl::Status ValidateHostStream(Stream stream, absl::string_view backend);

// Validates an AdamW step's arguments: the hyperparameters, a positive size,
// every buffer set, and step >= 1; INVALID_ARGUMENT naming the tensor or
// field otherwise.
absl::Status ValidateAdamWStep(const AdamWTensor& tensor,
                               const AdamWHyperparameters& hyper, int64_t step);

}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_MUON_KERNELS_H_
