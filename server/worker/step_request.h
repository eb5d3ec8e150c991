// A trainer's step as the worker's core reads it, and what the worker
// answers: the domain form of muonps.v1.StepRequest and StepResponse,
// converted once at the service edge (server/worker/wire.h). No tensor
// names travel with a step: parameter groups were attached once
// (TensorBinding::group) and a step carries their values by index. Plain
// values; thread-compatible.
#ifndef MUONPS_SERVER_WORKER_STEP_REQUEST_H_
#define MUONPS_SERVER_WORKER_STEP_REQUEST_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "server/worker/attach_request.h"

namespace muonps {
namespace worker {

// One parameter group's values for one step; < 0 keeps the step's own.
struct GroupHyperparameters {
  double lr = -1;
  double weight_decay = -1;
  // What the trainer's client steps the group's AdamW tensors with: the
  // workers apply no AdamW, they check that every trainer agrees.
  double adamw_lr = -1;
  double adamw_weight_decay = -1;
};

// Where one job matrix's gradient lies for one step, instead of its lent
// buffer (a CUDA trainer's gradient where backward allocated it).
struct GradientPlace {
  // Its position among the job matrices the attach request bound.
  int matrix = 0;
  CudaBufferRef buffer;
};

struct StepRequest {
  // Strictly increasing per job; every trainer passes the same id.
  int64_t step_id = 0;
  // Muon lr and weight decay, AdamW lr (< 0: the job's defaults).
  double lr = -1;
  double weight_decay = -1;
  double adamw_lr = -1;
  // By group index; empty: every tensor takes the step's own values.
  std::vector<GroupHyperparameters> groups;
  // A trainer that resumed from its state saved after this step (-1: the
  // initial parameters), on its first step since; unset: its parameters
  // hold what its worker last wrote into them.
  std::optional<int64_t> resumed_after;
  // Matrices whose gradient lies elsewhere this step; the others are read
  // from their lent buffers.
  std::vector<GradientPlace> gradients;
};

struct StepResponse {
  int64_t step_id = 0;
  // Committed before; nothing was computed by this call.
  bool already_applied = false;
  // Wall time here (from the first work, a stack computed ahead
  // included), and how long this worker's stacks kept its compute
  // stream busy (device time on a GPU), and the plan's prediction of that.
  double seconds = 0;
  double ns_seconds = 0;
  double predicted_ns_seconds = 0;
  int64_t bytes_moved = 0;  // sent and received
  // Matrices whose momentum restarted from zero this step.
  int64_t momentum_reset = 0;
  int64_t plan_version = 0;
  // The last step this worker committed (set on already_applied answers).
  int64_t last_step = -1;
  // This call repaired the trainer's parameters to hold the step (an
  // already_applied answer to a trainer that resumed after the step
  // before).
  bool repaired = false;
  // The step's first stack here computed while the ranks agreed
  // (StepStaging::ComputeAhead).
  bool computed_ahead = false;
  // Parameter elements of the step this worker applied as their updates
  // landed, before its commit (StepStaging::ApplyAsLanded); the commit
  // wrote the rest.
  int64_t applied_early = 0;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_REQUEST_H_
