// The step schedule: which matrices travel together (buckets, in reverse
// layer order, as backward produces gradients) and the one order in which
// every worker issues the transfers of a step.
//
// Every transfer is a collective among the workers of one owner group
// (all workers, without groups) rooted at the matrix's owner in that group,
// so all workers must issue the same transfers in the same order or NCCL
// deadlocks; the schedule is a pure function of the matrices and the plan,
// so every worker computes the same one. With owner groups
// (OwnershipPlan::groups) every item has one owner, one stack and one
// transfer of each kind per group, group after group. Thread-compatible.
#ifndef MUONPS_SCHEDULER_STEP_SCHEDULE_H_
#define MUONPS_SCHEDULER_STEP_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "newton_schulz/options.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace scheduler {

enum class TransferKind {
  kReduceToOwner,  // unreduced gradients: sum (mean) onto the owner
  // Row-sharded gradients: row ranges onto the owner (with exchange nodes,
  // through relays: RelaysRows, node_exchange.h).
  kGatherToOwner,
  kSendToOwner,         // a replicated gradient to an owner with no trainer
                        // (from the worker of trainer 0)
  kBroadcastFromOwner,  // the update, to every rank (replicated, unreduced)
  kScatterFromOwner,    // the update's row ranges back (row_sharded; relayed
                        // as they came)
  // Where the plan has exchange nodes (OwnershipPlan::exchange_nodes):
  // unreduced gradients summed in two levels with the bucket's others and
  // gathered to the owner, and the update back the reverse way to every
  // rank (NodeExchange, node_exchange.h), instead of kReduceToOwner and
  // kBroadcastFromOwner.
  kExchangeToOwner,
  kExchangeFromOwner,
};

absl::string_view TransferKindName(TransferKind kind);

struct Transfer {
  TransferKind kind = TransferKind::kBroadcastFromOwner;
  ItemRef item;
  int32_t owner = 0;  // index into the plan's worker_ids
  int64_t bytes = 0;  // the whole matrix's payload
  // The owner group it runs in (0 without groups): among its members only.
  int32_t group = 0;
  // An update of its owner's last stack in the step's order, in a group of
  // more than two workers: it goes back by a collective (a broadcast on the
  // group's communicator) even where the owner writes its other updates
  // into the trainers' staging with the copy engines (peer writes). The
  // copy engines take no SMs from Newton-Schulz, so they carry the updates
  // that go back while the owner still computes; the last ones go back
  // after it, when the SMs are free, and one owner's copies to n - 1 peers
  // go one after another from its own links (198 GB/s each on H200s),
  // where a broadcast's ring passes the update on through every member at
  // the link's rate. With one peer the copies are the faster (2 H200s: 198
  // against 158-170 GB/s for a broadcast per matrix,
  // bench/results/2026-11-29-h200x2-transfer-paths.jsonl). Never an
  // exchange's (kExchangeFromOwner): those go by the exchange.
  bool by_collective = false;
};

struct Bucket {
  // Matrices (all their experts) in the order their gradients arrive.
  std::vector<int32_t> matrices;
  int32_t first_layer = 0;  // highest layer in the bucket
  int32_t last_layer = 0;   // lowest
  int64_t bytes = 0;        // gradient payload of the bucket
  // Gradients to owners (none for replicated matrices), then updates back.
  std::vector<Transfer> to_owners;
  std::vector<Transfer> from_owners;
};

// One Newton-Schulz call of a stack: its next `count` items with
// `algorithm`.
struct StackChunk {
  int64_t count = 0;
  NsAlgorithm algorithm = NsAlgorithm::kNs5;
};

// Same-shape items of one owner, stacked (in arrival order) so that their
// momentum runs as one batched call, and their Newton-Schulz as the plan's
// batch of that shape says: one call per chunk.
//
// Stacks and the plan's Batch: a Batch holds every item of its shape (up to
// orientation) that its worker owns, and its parts are laid, in order, over
// those items in the order the owner computes them: its stacks of that
// shape in schedule order, each stack's items in stack order. A stack's
// chunks are its items cut where a part ends, each chunk with its part's
// algorithm. So a stack holding the whole batch runs exactly the parts;
// where buckets (or stack_bytes) cut a batch into several stacks, a part
// falling across two stacks runs as two smaller chunks of its algorithm,
// and chunks are never merged into calls larger than their parts. A stack
// whose (owner, shape) has no batch in the plan (a plan listing none) is one
// NS5 chunk. Either way the chunks' counts sum to items.size().
struct OwnerStack {
  int32_t owner = 0;  // index into the plan's worker_ids
  int64_t rows = 0;
  int64_t cols = 0;
  ItemRefs items;
  // In stack order; one unless the stack spans several of its batch's parts.
  absl::InlinedVector<StackChunk, 1> chunks;
  // The bucket whose gradients to owners complete the stack.
  int32_t ready_bucket = 0;
};

enum class PhaseKind {
  kToOwners,    // a bucket's gradients to their owners
  kCompute,     // a stack's momentum + Newton-Schulz (on its owner only)
  kFromOwners,  // a bucket's updates back from their owners
};

// One entry of the step's order: `index` is a bucket (transfers) or a
// stack (compute).
struct Phase {
  PhaseKind kind = PhaseKind::kToOwners;
  int32_t index = 0;
};

struct StepSchedule {
  std::vector<Bucket> buckets;
  std::vector<OwnerStack> stacks;
  // For each bucket j in arrival order: to_owners(j); compute of every
  // stack ready with j; from_owners(k) of every bucket k whose stacks have
  // all been computed by then. So later gradients move while earlier
  // stacks compute, and updates go back as soon as their stacks are done.
  std::vector<Phase> order;
  // The plan's owner groups (OwnershipPlan::groups): groups[g][s] the
  // worker at position s of group g, whose members Transfer::group g runs
  // among. Empty: one group of every worker.
  std::vector<std::vector<int32_t>> groups;
  // The plan's exchange nodes (OwnershipPlan::exchange_nodes), over which
  // the kExchange* transfers run. Empty: none.
  std::vector<std::vector<int32_t>> exchange_nodes;
};

struct ScheduleOptions {
  // A bucket closes before it would exceed this many gradient bytes; a
  // single larger matrix gets a bucket of its own.
  int64_t bucket_bytes = int64_t{64} << 20;
  // A stack closes before it would exceed this many fp32 bytes (a quarter
  // of it where the gradients move to their owner: unreduced and
  // row_sharded matrices, whose stacks wait for every gradient to land); a
  // single larger item gets a stack of its own. Larger stacks run
  // Newton-Schulz closer to the GPU's peak; smaller ones start sooner and
  // let updates go back sooner. Where updates move (more than one worker),
  // each (owner, shape)'s last stack also tapers into halves down to one
  // item or 16 MiB, so the step's tail after the last Newton-Schulz call is
  // one small piece's updates.
  int64_t stack_bytes = int64_t{1} << 30;
};

// INVALID_ARGUMENT naming the plan's field unless `plan` belongs to
// `matrices`, as a plan that arrives from elsewhere is checked before it is
// scheduled. Its layout (CheckPlanLayout): not when the names, expert
// counts or owners (out of range) disagree, no worker has a trainer
// (plan.dedicated), its owner groups are not valid (CheckOwnerGroups) or
// there are groups and a matrix is unreduced. Its batches: not when a
// batch of the plan disagrees with its owners: worker out of range, a second
// batch of one (worker, shape), an item that is not the worker's or not of the
// batch's shape, fewer or more items than the worker owns of that shape, an
// item missing from its batch (another listed twice), no parts, a part of count
// < 1, or counts not summing to the items. The planner's own plans pass.
absl::Status CheckStepPlan(const std::vector<MatrixSpec>& matrices,
                           const OwnershipPlan& plan);
absl::Status CheckPlanLayout(const std::vector<MatrixSpec>& matrices,
                             const OwnershipPlan& plan);

// The step schedule of `plan` (checked: CheckStepPlan's errors) under
// `options`; INVALID_ARGUMENT naming bucket_bytes or stack_bytes if <= 0.
absl::StatusOr<StepSchedule> BuildStepSchedule(
    const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
    const ScheduleOptions& options = {});

// The schedules of one plan for several bucket bounds, cut one at a time:
// the plan's stacks are built once (they do not depend on the bound); each
// Cut only cuts the buckets and orders the phases. Only the plan's layout
// is checked (CheckPlanLayout): its batches must agree with its owners
// (CheckStepPlan; the planner's own plans do).
// Thread-compatible; must not outlive the matrices and plan it was created
// with.
class StepScheduleCutter {
 public:
  // INVALID_ARGUMENT naming stack_bytes if <= 0, CheckPlanLayout's, or an
  // item missing from its owner's batch of its shape (plan.batches).
  static absl::StatusOr<StepScheduleCutter> Create(
      const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
      int64_t stack_bytes = ScheduleOptions{}.stack_bytes);

  // The plan's stacks and owner groups, with no buckets and no order yet:
  // the schedule that Cut completes. Once only (they move out).
  StepSchedule TakeStacks();

  // Makes `schedule` (TakeStacks's, cut before or not) what
  // BuildStepSchedule gives under `bucket_bytes`: its buckets, its stacks'
  // ready buckets and its order. INVALID_ARGUMENT naming bucket_bytes when
  // <= 0.
  absl::Status Cut(int64_t bucket_bytes, StepSchedule* schedule) const;

 private:
  StepScheduleCutter(const std::vector<MatrixSpec>& matrices,
                     const OwnershipPlan& plan)
      : matrices_(&matrices), plan_(&plan) {}

  const std::vector<MatrixSpec>* matrices_;
  const OwnershipPlan* plan_;
  // Gradients in the order backward yields them (matrix indices).
  std::vector<int32_t> arrival_;
  // Where every item (m, e) is: stack_of_[first_[m] + e].
  std::vector<int64_t> first_;
  // stack_of_[i] is the first group's; its copies follow it, group after
  // group.
  std::vector<int32_t> stack_of_;
  std::vector<OwnerStack> stacks_;
  int32_t groups_ = 1;  // owner groups
};

// Every transfer in issue order (the order without its compute phases):
// what each worker walks through per step.
std::vector<Transfer> IssueOrder(const StepSchedule& schedule);

// The matrices (indices) in the order backward yields their gradients: from
// the last layer to the first, and within a layer roughly in reverse
// registration order (later indices first).
std::vector<int32_t> ArrivalOrder(const std::vector<MatrixSpec>& matrices);

// Where the buckets of `arrival` under `bucket_bytes` end: one past each
// bucket's last position in `arrival`. A bucket closes before its gradient
// payload would pass the bound (one larger matrix makes a bucket alone).
std::vector<size_t> BucketEnds(const std::vector<MatrixSpec>& matrices,
                               const std::vector<int32_t>& arrival,
                               int64_t bucket_bytes);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_STEP_SCHEDULE_H_
