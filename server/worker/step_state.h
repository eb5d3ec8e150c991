// The state a worker's steps run on, owned by StepEngine and handed to one
// StepRun per round (under the engine's lock): what a plan version fixes
// (the schedule, the stacks owned here and their staged gradients; their
// momentum is the MomentumStore's), what an attached trainer lends, and
// what outlives a step (StepLedger: the steps committed here and the one
// staged, in doubt, between its vote and its decision).
//
// Memory of the staging (the price of atomic steps). Besides the stacks'
// momentum and gradients, an owner keeps a second momentum stack per
// batch (the step's new momentum, swapped in at commit:
// momentum_stacks.h) and, where Newton-Schulz runs in 16 bits, its updates
// in 16 bits; a worker with a trainer one buffer the size of that trainer's
// Muon parameters (its rows of sharded ones) in the update's precision, and
// one of its unreduced AdamW gradients in fp32: the updates and means a step
// stages before it commits. Thread-compatible.
#ifndef MUONPS_SERVER_WORKER_STEP_STATE_H_
#define MUONPS_SERVER_WORKER_STEP_STATE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "kernels/device_ops.h"
#include "kernels/muon_kernels.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"
#include "server/worker/job_plan.h"
#include "server/worker/momentum_stacks.h"
#include "server/worker/node_exchange_transfers.h"
#include "server/worker/staging_windows.h"
#include "server/worker/trainer_buffers.h"

namespace muonps {
namespace worker {

class MomentumStore;

// One schedule stack owned here (same-shape items, stacked contiguously so
// that momentum runs as one batched call, and Newton-Schulz as one call per
// chunk of the plan's batch: scheduler::OwnerStack). Its momentum is the
// same index's MomentumStack of the version's MomentumStacks.
struct ComputeBatch {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<scheduler::ItemRef> items;  // stack order
  // Consecutive runs of items, each orthogonalized by one call with its
  // algorithm; counts sum to items.size().
  std::vector<scheduler::StackChunk> chunks;
  // Gradients in (staged from the trainer or the transport), Newton-Schulz's
  // fp32 results out.
  std::unique_ptr<kernels::FloatBuffer> staged;
  // Those results rounded to the plan's update_dtype, where it is 16-bit,
  // for what leaves from the owner's memory (a scatter's rows, or an owner
  // with no trainer); fp32 updates are read from `staged`.
  kernels::TypedBuffer updates;
};

// What a plan version fixes for this worker (BuildPlanState;
// StepEngine::SetPlan allocates its buffers and sets `momentum`).
struct PlanState {
  JobSettings job;
  int64_t version = 0;
  int rank = -1;  // this worker's rank; -1: not in the plan
  std::vector<std::string> addresses;  // data addresses by rank
  std::vector<scheduler::MatrixSpec> matrices;
  scheduler::OwnershipPlan ownership;
  // The plan's owner groups; this worker's group (0 when not in the plan)
  // and its members: its transfers run among them only.
  scheduler::OwnerGroups groups;
  int32_t group = 0;
  std::vector<int32_t> group_members;
  scheduler::StepSchedule schedule;
  uint64_t schedule_digest = 0;       // ScheduleDigest(schedule)
  kernels::MuonHyperparameters muon;  // the job's, defaults filled in
  // The precision updates travel and wait in: the kernels' update_dtype()
  // (every rank of a round has the same, StepHeader::update_dtype).
  DType update_dtype = DType::kFloat32;
  std::vector<ComputeBatch> batches;  // the schedule's stacks owned here
  std::vector<int> batch_of_stack;    // by schedule stack; -1: not owned
  // The engine's store (not owned): its installed stacks are this
  // version's momentum, and where each owned item sits (slots).
  MomentumStore* momentum = nullptr;
  // The backend's lender (not owned; null: updates travel by the
  // transport), the peers' staging windows opened for this version, and
  // where each matrix's update waits in a window (FullStagedAt).
  WindowLender* lender = nullptr;
  PeerWindows windows;
  std::vector<int64_t> window_at;
  // Control messages pass through it (ControlChannel; the largest matrix).
  std::unique_ptr<kernels::FloatBuffer> scratch;
  // A worker with no trainer: the zero parts it adds to every sum, and
  // where it receives means it does not keep (grown as needed).
  std::unique_ptr<kernels::FloatBuffer> zeros, sink;
  // The two-level exchange's packs (schedule.exchange_nodes; grown as
  // needed).
  ExchangeState exchange;
  // With exchange nodes: where this worker keeps the row_sharded rows it
  // relays between the nodes in one launch (row_relay.h;
  // scheduler::ExchangeBuffers::relay).
  std::unique_ptr<kernels::FloatBuffer> relay;

  // The staged gradient of an owned item's slot (momentum_stacks.h).
  float* StagedData(const ItemSlot& s) const {
    const ComputeBatch& b = batches[s.batch];
    return b.staged->data() + s.slot * b.rows * b.cols;
  }
  // The update of an owned item's slot, in update_dtype.
  void* UpdateData(const ItemSlot& s) const {
    const ComputeBatch& b = batches[s.batch];
    const int64_t first = s.slot * b.rows * b.cols;
    return b.updates ? b.updates.at(first) : b.staged->data() + first;
  }
  // Whether this worker owns, in its group, what the first group's
  // `owner` owns.
  bool OwnsInGroup(int32_t owner) const {
    return rank >= 0 && groups.Owns(rank, owner);
  }
  // Ranks with a trainer (the first ones).
  int trainers() const {
    return static_cast<int>(ownership.worker_ids.size()) - ownership.dedicated;
  }
  // Allocates the owned stacks' staged gradients, their 16-bit updates
  // (update_dtype), `scratch`, the exchange's packs and the relay buffer
  // (zero-filled: slow for large stacks, call it with no lock held).
  // RESOURCE_EXHAUSTED naming the buffer when the device is full.
  absl::Status AllocateBuffers(kernels::DeviceOps& ops);
  // What the version fixes of the momentum owned here: the layout
  // MomentumStore::Prepare allocates.
  MomentumStacks MomentumLayout() const;
};

// The state `plan` fixes for worker `worker_id`: its rank (-1: not in the
// plan), the ranks' data addresses (`addresses` by worker id; "" where
// unknown), the step schedule and the stacks this worker owns as compute
// batches; no buffers yet (AllocateBuffers), no momentum store.
// INVALID_ARGUMENT naming the plan field for an inconsistent plan.
absl::StatusOr<PlanState> BuildPlanState(
    const JobPlan& plan, const std::map<std::string, std::string>& addresses,
    const std::string& worker_id);

// One lent tensor as the step uses it.
struct Binding {
  // The fp32 gradient the step reads: the trainer's itself (fp32), or the
  // worker's copy of it (bf16), widened at the start of every step.
  float* grad = nullptr;
  // The trainer's gradient this step: its lent buffer (`home_grad`), or
  // where the step request placed it (AttachedTrainer::PlaceGradients).
  void* lent_grad = nullptr;
  void* home_grad = nullptr;
  void* param = nullptr;  // lent, of `dtype`
  DType dtype = DType::kFloat32;
  int64_t elements = 0;        // of grad
  int64_t param_elements = 0;  // of param
  // Where its step's update (Muon matrices: AttachedTrainer::updates) or
  // mean gradient (unreduced AdamW tensors: AttachedTrainer::means) waits
  // until the step commits, in elements.
  int64_t staged_at = 0;
  // Where AttachedTrainer::kept keeps its parameter's values while a step
  // applied early is undoable, in bytes.
  int64_t kept_at = 0;
  // Takes the lent buffers (`grad` reads the lent one until
  // AttachedTrainer::AllocateWidened gives a bf16 binding its fp32 copy).
  void Lend(const LentTensor& lent) {
    grad = static_cast<float*>(lent.grad);
    lent_grad = lent.grad;
    home_grad = lent.grad;
    param = lent.param;
    dtype = lent.dtype;
    ready = lent.ready;
  }
  // TrainerBuffers::WaitForGradient's index of its gradient's own event;
  // -1: the step's ready event orders it.
  int ready = -1;
  // Row-sharded gradient with the whole parameter on the trainer.
  bool full_param = false;
  scheduler::Layout layout = scheduler::Layout::kReplicated;
  // Its parameter group (StepRequest::groups index); -1: none.
  int group = -1;
};

// The trainer attached to this worker.
struct AttachedTrainer {
  std::unique_ptr<TrainerBuffers> buffers;
  int rank = 0;
  int count = 1;
  std::vector<Binding> matrices;  // by job matrix
  // By job matrix: its place among the matrices in the order the attach
  // request bound them, the order a commit writes the parameters in (the
  // parameters' progress word counts matrices in it).
  std::vector<int> bound_position;
  std::vector<std::pair<std::string, Binding>> adamw;  // name order
  // Groups its tensors were attached in (1 + the largest index), and the
  // digest of its bindings the round's agreement compares (TensorsHash).
  int group_count = 0;
  uint64_t tensors_hash = 0;
  // Its unreduced AdamW tensors (indices into `adamw`), whose means a step
  // stages, and whether it keeps the whole parameter of every matrix (what
  // a repair can copy): fixed by its bindings.
  std::vector<int> unreduced;
  bool full_params = true;
  // fp32 copies of the bf16 gradients (Binding::grad points into it).
  std::unique_ptr<kernels::FloatBuffer> widened;
  // A step's updates of every matrix (in the plan's update_dtype) and the
  // means of its unreduced AdamW gradients (fp32), until it commits
  // (Binding::staged_at).
  kernels::TypedBuffer updates;
  std::unique_ptr<kernels::FloatBuffer> means;
  // `updates` as lent to the workers of its host (id 0: not lent), and the
  // window's landing words (staging_windows.h; null: not lent).
  WindowRecord window{};
  uint64_t* landing = nullptr;
  // Room for every matrix's parameter (Binding::kept_at): what a step
  // applied early overwrote, until it commits (EarlyApply::kUndoable).
  // Null until AllocateKept.
  std::unique_ptr<kernels::FloatBuffer> kept;
  bool kept_refused = false;  // AllocateKept failed: not tried again
  // What its step record (lending/step_record.h) held when it attached:
  // what a worker before this one wrote (all -1: none, or none lent).
  StepRecord inherited;

  // Points every bf16 binding's `grad` at its own range of a new `widened`
  // buffer from `ops`, and allocates `updates` (of `update_dtype`) and
  // `means`; fp32 bindings read the lent gradient in place. With a
  // `lender`, a trainer that keeps every parameter whole gets its `updates`
  // from it, lent (`window`); where the lender cannot, from `ops`.
  // RESOURCE_EXHAUSTED naming the buffer when the device is full.
  absl::Status AllocateWorkBuffers(kernels::DeviceOps& ops, DType update_dtype,
                                   WindowLender* lender);
  // Allocates `kept` (once). RESOURCE_EXHAUSTED naming it when the device
  // is full.
  absl::Status AllocateKept(kernels::DeviceOps& ops);
  // Points every job matrix's gradient at where a step's request places it
  // (StepRequest::gradients: by position among the bound matrices), and
  // the others back at their lent buffers. INVALID_ARGUMENT naming
  // `gradients[i]` for a position out of range or given twice, or a place
  // `buffers` cannot map; nothing changes then.
  absl::Status PlaceGradients(const std::vector<GradientPlace>& places);
};

// What the parameters get when a staged step commits: param[first, +count)
// of matrix `matrix` <- param * decay + step * updates[staged_at, +count).
struct ParamApply {
  int matrix = 0;
  int64_t first = 0;
  int64_t count = 0;
  int64_t staged_at = 0;
  float decay = 1;
  float step = 0;
  // Landed by rank `writer`'s copy into the staging (staging_windows.h)
  // in run `run` of the step's updates-back phases: nothing in this
  // worker's stream order says when, only that writer's landing word or
  // its vote. -1: ordered by this worker's stream.
  int32_t writer = -1;
  int32_t run = -1;
  // In the parameters already, applied as it landed
  // (StepStaging::ApplyAsLanded): the commit skips it.
  bool applied = false;
};

// How a staged step's updates reach the parameters before its commit.
enum class EarlyApply {
  kNone,  // at the commit, all at once
  // One worker alone (and where StepContext::apply_early allows it) needs
  // only its gradients checked: decided then, each run of updates applied
  // as it lands, beside the next stack's Newton-Schulz; the commit writes
  // the rest (the AdamW means, the step record, the momentum). A failure
  // after the decision leaves the parameters part-way: DATA_LOSS.
  kDecided,
  // Several workers: each run of updates this worker's stream orders (its
  // own, and those received by the transport; not a peer's copies) applied
  // as it lands, before the votes, with what it overwrote kept first
  // (AttachedTrainer::kept). The commit keeps them; any other end of the
  // round puts the kept values back (StepStaging::UndoEarlyApplies), so a
  // step not committed changed nothing, as before.
  kUndoable,
};

// A step computed here and not committed yet: its momentum in the
// MomentumStacks' next_momentum, its updates and AdamW means in the trainer's
// `updates` and `means`.
struct StagedStep {
  int64_t step_id = -1;  // -1: nothing staged
  // This rank voted yes: only rank 0's decision (or a later round's
  // resolution) may commit or drop it. Until then it is in doubt.
  bool voted = false;
  uint64_t decider = 0;  // instance of the rank 0 that ran it
  // Whether its updates go into the parameters as they land, and how.
  EarlyApply early = EarlyApply::kNone;
  // Decided before its updates landed (EarlyApply::kDecided).
  bool decided_early() const { return early == EarlyApply::kDecided; }
  std::vector<ParamApply> applies;
  // A mark of the compute stream after the updates applied there before
  // the votes (EarlyApply::kUndoable; the peers' copies each after its
  // writer's landing word), which the transfer stream does not wait for in
  // the stage; -1: none. The commit orders its writes after it.
  int applied_mark = -1;
  // Unreduced AdamW tensors (indices into AttachedTrainer::adamw) whose mean
  // gradient is staged.
  std::vector<int> means;
};

// What a worker knows of the job's steps across rounds and plan versions.
struct StepLedger {
  explicit StepLedger(uint64_t instance_id) : instance(instance_id) {}
  // This worker process (random): a restarted worker is another instance.
  const uint64_t instance;
  // Committed here; read without the engine's lock by status calls.
  std::atomic<int64_t> last{-1};
  // The plan version `last` committed under (0: none yet); read like last.
  std::atomic<int64_t> last_version{0};
  // Known committed on every rank: a retry at or below it is answered
  // here, without the peers.
  int64_t settled = -1;
  StagedStep staged;
  // The committed step whose AdamW means the trainer's staging still holds
  // (until the next step stages): a retry answered already_applied writes
  // them into the lent gradients again, in case the trainer wrote its own
  // gradients back before retrying. -1: none.
  int64_t means_step = -1;
  // The step the attached trainer's parameters hold when it is below
  // `last`: a trainer that resumed from state saved before this worker's
  // last commit (an earlier trainer of its rank died after it). No step is
  // answered here until a repair brings the parameters to `last`.
  std::optional<int64_t> trainer_behind;
  // `last` when the trainer attached: a step committed since went into its
  // parameters.
  int64_t last_at_attach = -1;

  // The highest round rank 0 numbered that this worker took part in (0:
  // none): rank 0 numbers each round above every rank's, so what a round
  // writes into the peers' landing words (staging_windows.h) is above what
  // any earlier round left there.
  uint64_t round = 0;

  // The step the attached trainer's parameters hold.
  int64_t params_step() const { return trainer_behind.value_or(last.load()); }
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_STATE_H_
