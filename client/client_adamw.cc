// The client's AdamW, the one AdamW of host trainers (a CUDA trainer steps
// its tensors with torch's): each step's values per parameter group,
// the step of every AdamW tensor in the lent segment once per committed
// step id, and its moments and step count for checkpoints.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/client_impl.h"
#include "common/status.h"

namespace muonps {

Client::Impl::AdamWValues Client::Impl::ResolveAdamW(
    const StepOptions& options) const {
  AdamWValues out;
  out.step = adamw;
  if (options.adamw_lr >= 0) out.step.lr = options.adamw_lr;
  out.groups.reserve(options.groups.size());
  for (const GroupHyperparameters& g : options.groups) {
    kernels::AdamWHyperparameters h = out.step;
    if (g.adamw_lr >= 0) h.lr = g.adamw_lr;
    if (g.adamw_weight_decay >= 0) h.weight_decay = g.adamw_weight_decay;
    out.groups.push_back(h);
  }
  return out;
}

absl::Status Client::Impl::ApplyAdamW(int64_t step_id,
                                      const AdamWValues& values,
                                      StepResult* result) {
  if (step_id <= last_adamw_step) return absl::OkStatus();
  for (Tensor& t : tensors) {
    if (t.muon) continue;
    MUONPS_ASSIGN_OR_RETURN(const TensorBuffers b, BuffersOf(t));
    MUONPS_RETURN_IF_ERROR(
        kernels.AdamWStep({t.name, b.param, b.grad, t.exp_avg.data(),
                           t.exp_avg_sq.data(), t.elements},
                          values.For(t), adamw_steps + 1, kHostStream));
  }
  ++adamw_steps;
  last_adamw_step = step_id;
  result->adamw_applied = true;
  return absl::OkStatus();
}

absl::StatusOr<std::pair<const float*, const float*>> Client::AdamWState(
    const std::string& name) const {
  const Impl::Tensor* t = impl_->Find(name);
  if (t == nullptr || t->muon || impl_->device.is_cuda()) {
    return FieldError(
        absl::StatusCode::kNotFound, "name",
        absl::StrCat(Quoted(name), " is not an AdamW tensor of this client"));
  }
  return std::make_pair(t->exp_avg.data(), t->exp_avg_sq.data());
}

absl::Status Client::RestoreAdamW(const std::string& name,
                                  const std::vector<float>& exp_avg,
                                  const std::vector<float>& exp_avg_sq) {
  Impl::Tensor* t = impl_->Find(name);
  if (t == nullptr || t->muon || impl_->device.is_cuda()) {
    return FieldError(
        absl::StatusCode::kNotFound, "name",
        absl::StrCat(Quoted(name), " is not an AdamW tensor of this client"));
  }
  if (static_cast<int64_t>(exp_avg.size()) != t->elements ||
      static_cast<int64_t>(exp_avg_sq.size()) != t->elements) {
    return InvalidField(
        absl::StrCat("tensor ", Quoted(name)),
        absl::StrCat("moments must hold ", t->elements, " floats"));
  }
  t->exp_avg = exp_avg;
  t->exp_avg_sq = exp_avg_sq;
  return absl::OkStatus();
}

int64_t Client::adamw_steps() const { return impl_->adamw_steps; }
void Client::set_adamw_steps(int64_t steps) { impl_->adamw_steps = steps; }
int64_t Client::last_adamw_step() const { return impl_->last_adamw_step; }
void Client::set_last_adamw_step(int64_t step_id) {
  impl_->last_adamw_step = step_id;
}

}  // namespace muonps
