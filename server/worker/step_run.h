// One optimizer step of one worker, run together with the other workers of
// the plan over a Transport: the data path of "One step" in DESIGN.md.
//
// StepRun walks the plan's step schedule (every worker issues the same
// transfers in the same order, so none deadlocks):
//   agree on the step id and on gradient finiteness (a NaN/Inf anywhere
//   rejects the step on every worker before anything changes);
//   every bucket's gradients to owners, in schedule order (replicated:
//   none; unreduced: reduce, mean in trainer order; row_sharded: gather
//   rows); momentum + Newton-Schulz on the owner's same-shape stacks, each
//   stack holding all its owned matrices of that shape; every bucket's
//   updates back, in schedule order (broadcast, or scatter rows), applied
//   in place to the trainer's parameters; finally the AdamW tensors'
//   gradients averaged for the clients.
// (Whole-step stacks run NS faster than per-bucket ones; the price is that
// transfers do not overlap compute yet: one stream carries both.)
// Every data call is enqueued on the device's stream (kHostStream on the
// CPU, where it has finished when it returns); the run ends by waiting for
// the transport and the stream, so a lost peer fails the step within the
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

// Same-shape owned matrices of one bucket, stacked contiguously so that
// momentum and Newton-Schulz run as one batched call.
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
  std::vector<ComputeBatch> batches;         // by shape, across buckets
  std::vector<std::vector<ItemSlot>> slots;  // by matrix, expert
  // Receives updates of matrices owned elsewhere (the largest matrix).
  std::unique_ptr<kernels::FloatBuffer> scratch;

  // The stack slot of `item` (owned here), as a pointer into `buffer`.
  float* SlotData(const ItemSlot& s, bool momentum) const;
};

// One lent tensor as the step uses it.
struct Binding {
  float* grad = nullptr;
  float* param = nullptr;
  int64_t elements = 0;  // of grad
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
};

class StepRun {
 public:
  // Everything must outlive the run.
  StepRun(const std::string& worker_id, PlanState* plan,
          const AttachedTrainer* trainer, transport::Transport* transport,
          kernels::DeviceOps* ops, kernels::MuonKernels* kernels,
          absl::Duration timeout);
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
  absl::Status Agree(const v1::StepRequest& request);
  std::string LocalProblem();
  absl::Status ToOwners(const scheduler::Bucket& bucket);
  absl::Status Compute();
  absl::Status FromOwners(const scheduler::Bucket& bucket,
                          const v1::StepRequest& request);
  absl::Status AverageAdamWGradients();
  // Moves `bytes` (a multiple of 4) of host memory through the transport's
  // memory: `exchange` runs the transport calls on the staged copy.
  absl::Status ThroughTransportMemory(
      void* host, size_t bytes,
      const std::function<absl::Status(void* data)>& exchange);
  std::pair<int64_t, int64_t> RowsOfTrainer(int64_t rows, int trainer) const;

  const std::string& worker_id_;
  PlanState& plan_;
  const AttachedTrainer& trainer_;
  transport::Transport& t_;
  kernels::DeviceOps& ops_;
  kernels::MuonKernels& kernels_;
  const Stream stream_;
  const absl::Duration timeout_;
  std::vector<int32_t> trainer_rank_of_;  // by worker rank
  std::vector<int> reduce_order_;         // worker ranks by trainer rank
  double ns_seconds_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_RUN_H_
