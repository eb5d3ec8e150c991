// One optimizer step of one worker, run together with the other workers of
// the plan over a Transport: the data path of "One step" in DESIGN.md.
//
// StepRun walks the plan's step schedule (every worker issues the same
// transfers in the same order, so none deadlocks):
//   agree on the step id and on gradient finiteness (a NaN/Inf anywhere
//   rejects the step on every worker before anything changes);
//   then the schedule's order: each bucket's gradients to owners
//   (replicated: none; unreduced: reduce, mean in trainer order;
//   row_sharded: gather rows); momentum + Newton-Schulz of every stack of
//   this worker those gradients complete (same-shape items, batched); the
//   updates of every bucket whose stacks are all computed, back (broadcast,
//   or scatter rows) and applied in place to the trainer's parameters;
//   finally the AdamW tensors' gradients averaged for the clients.
// Transfers run on the ops' stream() and compute on its compute_stream():
// bucket k+1's gradients move while bucket k's stacks compute. Each side
// waits for the other (DeviceOps::Order, an event on CUDA) only where it
// reads what the other wrote. On the CPU both are kHostStream and every
// call has finished when it returns. The run ends by waiting for the
// transport and the stream, so a lost peer fails the step within the
// transport's timeout instead of hanging.
//
// The structs here are the state a plan version and an attached trainer
// fix; StepEngine owns them and hands them to one StepRun per step (under
// its lock). A StepRun is used once, by one thread.
#ifndef MUONPS_SERVER_WORKER_STEP_RUN_H_
#define MUONPS_SERVER_WORKER_STEP_RUN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dtype.h"
#include "kernels/device_ops.h"
#include "kernels/muon_kernels.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/worker.pb.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"
#include "server/worker/trainer_buffers.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// One schedule stack owned here (same-shape items, stacked contiguously so
// that momentum and Newton-Schulz run as one batched call).
struct ComputeBatch {
  int64_t rows = 0;
  int64_t cols = 0;
  kernels::NsAlgorithm algorithm = kernels::NsAlgorithm::kNs5;
  std::vector<scheduler::ItemRef> items;  // stack order
  // Gradients in (staged from the trainer or the transport), updates out.
  std::unique_ptr<kernels::FloatBuffer> staged;
  std::unique_ptr<kernels::FloatBuffer> momentum;  // fp32, on the device
  std::vector<bool> has_momentum;  // per slot: stepped or restored
};

// Where an owned item's stack slot is; batch < 0: not owned here.
struct ItemSlot {
  int batch = -1;
  int slot = 0;
};

// What a plan version fixes for this worker (built by StepEngine::SetPlan).
struct PlanState {
  v1::JobSpec job;
  int64_t version = 0;
  int rank = -1;  // this worker's rank; -1: not in the plan
  std::vector<std::string> addresses;  // data addresses by rank
  std::vector<scheduler::MatrixSpec> matrices;
  scheduler::OwnershipPlan ownership;
  scheduler::StepSchedule schedule;
  kernels::MuonHyperparameters muon;         // the job's, defaults filled in
  std::vector<ComputeBatch> batches;         // the schedule's stacks owned here
  std::vector<int> batch_of_stack;           // by schedule stack; -1: not owned
  std::vector<std::vector<ItemSlot>> slots;  // by matrix, expert
  // Receives updates of matrices owned elsewhere (the largest matrix).
  std::unique_ptr<kernels::FloatBuffer> scratch;
  // A worker with no trainer: the zero parts it adds to every sum, and
  // where it receives means it does not keep (grown as needed).
  std::unique_ptr<kernels::FloatBuffer> zeros, sink;

  // The stack slot of `item` (owned here), as a pointer into `buffer`.
  float* SlotData(const ItemSlot& s, bool momentum) const;
};

// One lent tensor as the step uses it.
struct Binding {
  // The fp32 gradient the step reads: the lent buffer itself (fp32), or the
  // worker's copy of it (bf16), widened at the start of every step.
  float* grad = nullptr;
  void* lent_grad = nullptr;
  void* param = nullptr;  // lent, of `dtype`
  DType dtype = DType::kFloat32;
  int64_t elements = 0;  // of grad
  // Takes the lent buffers (`grad` reads the lent one until
  // AttachedTrainer::AllocateWidened gives a bf16 binding its fp32 copy).
  void Lend(const LentTensor& lent) {
    grad = static_cast<float*>(lent.grad);
    lent_grad = lent.grad;
    param = lent.param;
    dtype = lent.dtype;
  }
  // Row-sharded gradient with the whole parameter on the trainer.
  bool full_param = false;
  scheduler::Layout layout = scheduler::Layout::kReplicated;
};

// The trainer attached to this worker.
struct AttachedTrainer {
  std::unique_ptr<TrainerBuffers> buffers;
  int rank = 0;
  int count = 1;
  std::vector<Binding> matrices;                       // by job matrix
  std::vector<std::pair<std::string, Binding>> adamw;  // name order
  // fp32 copies of the bf16 gradients (Binding::grad points into it).
  std::unique_ptr<kernels::FloatBuffer> widened;

  // Points every bf16 binding's `grad` at its own range of a new `widened`
  // buffer from `ops`; fp32 bindings read the lent gradient in place.
  absl::Status AllocateWidened(kernels::DeviceOps& ops);
};

class StepRun {
 public:
  // Everything must outlive the run. `trainer` is null on a worker with no
  // trainer (PlanState's ownership.dedicated ranks, the last ones): it
  // sends no header, learns the step id and what it needs of the trainers'
  // tensors from rank 0, adds zeros to every sum, and applies nothing.
  StepRun(PlanState* plan, const AttachedTrainer* trainer,
          transport::Transport* transport, kernels::DeviceOps* ops,
          kernels::MuonKernels* kernels, absl::Duration timeout);
  StepRun(const StepRun&) = delete;
  StepRun& operator=(const StepRun&) = delete;

  // Runs the step. INVALID_ARGUMENT when it was rejected on every worker
  // with nothing changed (non-finite gradient, mismatched step ids or
  // trainers; the transport stays usable); any other error means the
  // transport broke and must be rebuilt.
  absl::StatusOr<v1::StepResponse> Run(const v1::StepRequest& request);

 private:
  absl::StatusOr<v1::StepResponse> RunWithTrainerReady(
      const v1::StepRequest& request);
  // Widens the bf16 gradients into fp32 copies (in stream order).
  absl::Status WidenGradients();
  absl::Status Agree(const v1::StepRequest& request);
  // Rank 0 tells workers with no trainer the unreduced AdamW sizes and
  // which row-sharded matrices have whole parameters on the trainers.
  absl::Status ShareFollowerInfo();
  // Whether the trainers keep the whole parameter of `matrix` (row_sharded
  // gradients with replicated parameters: the update is broadcast).
  bool FullParam(int32_t matrix) const;
  std::string LocalProblem();
  absl::Status ToOwners(const scheduler::Bucket& bucket);
  absl::Status Compute(ComputeBatch& batch);
  absl::Status FromOwners(const scheduler::Bucket& bucket,
                          const v1::StepRequest& request);
  absl::Status AverageAdamWGradients();
  // Moves `bytes` (a multiple of 4) of host memory through the transport's
  // memory: `exchange` runs the transport calls on the staged copy.
  absl::Status ThroughTransportMemory(
      void* host, size_t bytes,
      const std::function<absl::Status(void* data)>& exchange);
  std::pair<int64_t, int64_t> RowsOfTrainer(int64_t rows, int trainer) const;

  PlanState& plan_;
  const AttachedTrainer* const trainer_;  // null: no trainer
  transport::Transport& t_;
  kernels::DeviceOps& ops_;
  kernels::MuonKernels& kernels_;
  const Stream stream_;   // transfers, the trainer's signals
  const Stream compute_;  // momentum and Newton-Schulz
  const absl::Duration timeout_;
  const int trainers_;    // ranks with a trainer (the first ones)
  int64_t step_id_ = -1;  // agreed
  absl::Status intact_;   // of the trainer's memory, checked at the start
  std::vector<int32_t> trainer_rank_of_;  // by worker rank; -1: no trainer
  // Worker ranks by trainer rank, then those with no trainer.
  std::vector<int> reduce_order_;
  std::vector<int64_t> follower_adamw_;       // no trainer: unreduced sizes
  std::vector<int64_t> follower_full_param_;  // no trainer: by matrix
  double ns_seconds_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_RUN_H_
