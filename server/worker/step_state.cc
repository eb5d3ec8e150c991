#include "server/worker/step_state.h"

#include "common/status.h"

namespace muonps {
namespace worker {

absl::Status AttachedTrainer::AllocateWorkBuffers(kernels::DeviceOps& ops) {
  std::vector<Binding*> narrow;
  int64_t total = 0;
  int64_t staged = 0;
  for (Binding& b : matrices) {
    if (b.dtype != DType::kFloat32) narrow.push_back(&b);
    b.staged_at = staged;
    staged += b.param_elements;
  }
  for (auto& [name, b] : adamw) {
    if (b.dtype != DType::kFloat32) narrow.push_back(&b);
    if (b.layout != scheduler::Layout::kUnreduced) continue;
    b.staged_at = staged;
    staged += b.elements;
  }
  for (Binding* b : narrow) total += b->elements;
  widened.reset();
  staging.reset();
  MUONPS_ASSIGN_OR_RETURN(
      staging, ops.Allocate(std::max<int64_t>(staged, 1),
                            "staged updates (one parameter-sized buffer)"));
  if (total == 0) return absl::OkStatus();
  MUONPS_ASSIGN_OR_RETURN(widened,
                          ops.Allocate(total, "fp32 copies of bf16 gradients"));
  float* next = widened->data();
  for (Binding* b : narrow) {
    b->grad = next;
    next += b->elements;
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
