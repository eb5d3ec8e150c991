// What the ownership planner reads and writes: matrices, workers, options,
// and the resulting OwnershipPlan. Plain values; thread-compatible.
#ifndef MUONPS_SCHEDULER_PLAN_TYPES_H_
#define MUONPS_SCHEDULER_PLAN_TYPES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "common/dtype.h"
#include "newton_schulz/options.h"
#include "scheduler/cost_model.h"
#include "scheduler/cost_table.h"

namespace muonps {
namespace scheduler {

// How the trainer ranks hold a matrix's gradient (docs/architecture.md,
// "One step's data flow").
enum class Layout {
  kReplicated,  // every rank holds the full, reduced gradient
  kUnreduced,   // every rank holds its partial gradient: reduce to the owner
  kRowSharded,  // each rank holds a row range: gather to the owner
};

absl::string_view LayoutName(Layout layout);

struct MatrixSpec {
  std::string name;
  int64_t rows = 0;
  int64_t cols = 0;
  // > 1: a 3-D stack of `experts` rows x cols matrices; each expert is
  // owned (and may be placed) separately.
  int64_t experts = 1;
  DType dtype = DType::kFloat32;  // of the trainer's gradient and param
  Layout layout = Layout::kReplicated;
  // kRowSharded only: the trainers split the experts, each holding whole
  // experts, rather than each expert's rows (common/row_ranges.h).
  bool shard_experts = false;
  // Layer index in forward order; the step schedule walks layers backwards.
  int32_t layer = 0;
};

// Whether a matrix of `matrices` is a row_sharded stack sharded on its
// experts (MatrixSpec::shard_experts): its trainers hold whole experts.
bool HoldsWholeExperts(const std::vector<MatrixSpec>& matrices);

// Which trainer shard each worker's trainer holds, so that a plan can leave
// each whole expert of a stack sharded on its experts
// (MatrixSpec::shard_experts) with the worker whose trainer holds it: that
// expert's gradient and update then never move (common/row_ranges.h, the
// one rule of who holds what). The trainers of a replica group (or of the
// job, without replicas) split every row_sharded matrix into `shards`
// shards; worker w's trainer holds shard shard_of[w], or -1 (no trainer,
// or its rank not known). Default: not known.
struct TrainerShards {
  int32_t shards = 0;
  std::vector<int32_t> shard_of;  // by worker index; empty: not known

  bool known() const { return shards > 0 && !shard_of.empty(); }
  // The shard holding expert `expert` of `m` whole, or -1 when `m` is not
  // sharded on its experts (or nothing is known).
  int32_t ShardOfExpert(const MatrixSpec& m, int64_t expert) const;
  // By shard: the first of `workers` (worker indices) whose trainer holds
  // it, or -1.
  std::vector<int32_t> HoldersAmong(const std::vector<int32_t>& workers) const;
  // The shards of `workers` (worker indices), in their order: what a plan
  // of those workers alone takes (PlanRanks). Not known stays not known.
  TrainerShards Among(const std::vector<int32_t>& workers) const;
};

struct WorkerSpec {
  std::string id;
  // Measured NS times of this worker's device; null: use `rates` only.
  std::shared_ptr<const CostTable> costs;
  DeviceRates rates;
  // Multiplies the device's speed (0.5: half as fast as `costs` says).
  double speed = 1.0;
  // Bytes of device memory the worker may use: owned matrices plus
  // PlanOptions::workspace_bytes of Newton-Schulz work buffers.
  int64_t memory_bytes = int64_t{80} << 30;
  // Shares its GPU with a trainer rank (else a dedicated optimizer worker).
  bool colocated = true;
  // A worker that is leaving (draining): still a rank of the plan, so the
  // momentum it owned moves to the new owners at the plan's first step, but
  // it owns nothing. Its memory_bytes is not checked.
  bool owns_nothing = false;
};

struct PlanOptions {
  AlgorithmPolicy algorithm = AlgorithmPolicy::kAuto;
  int ns_steps = 5;
  // Reserved on every worker for Newton-Schulz work buffers.
  int64_t workspace_bytes = int64_t{2} << 30;
  // Local search stops after this many accepted moves or swaps.
  int max_improvements = 20000;
  // Instances with at most this many matrices (and workers^matrices at most
  // 2e5) are solved exactly by enumeration.
  int exact_max_items = 10;
  // Stable re-planning: stop moving matrices once the predicted maximum is
  // within this fraction of a fresh plan's.
  double replan_tolerance = 0.02;
  // With PlanInput::trainer_shards known: own every whole expert where its
  // trainer holds it (where that worker has the memory), and place the
  // rest around them, rather than only where that costs no worker more
  // Newton-Schulz. The holders then compute more, and no whole expert
  // moves: the faster where moving experts costs more than computing
  // them (PlanOnTopology clocks both).
  bool experts_at_holders = false;
};

// Bytes a worker sets aside to own one rows x cols matrix: the fp32
// momentum and staging for the incoming gradient and the outgoing update.
// Newton-Schulz work buffers are transient, per batch: they come out of the
// worker's PlanOptions::workspace_bytes.
int64_t OwnedBytes(const MatrixSpec& matrix);

// Bytes of one expert's gradient as the trainer holds it.
int64_t PayloadBytes(const MatrixSpec& matrix);

// One owned 2-D matrix: matrix index and expert index within it.
struct ItemRef {
  int32_t matrix = 0;
  int32_t expert = 0;
};

// Items of one batch or stack: often a single one (a shape that one matrix
// has), held inline then.
using ItemRefs = absl::InlinedVector<ItemRef, 1>;

// A matrix's owners by expert: inline for a matrix of one expert.
using ItemOwners = absl::InlinedVector<int32_t, 1>;

// All same-shape matrices one worker owns (up to orientation: rows <= cols),
// and how it runs their Newton-Schulz: as consecutive calls (parts), each of
// `count` matrices with its own algorithm. A batch that is not split has
// exactly one part; one is split only where the worker's measured times
// favour it (BatchSplitter), so without a cost table never.
struct Batch {
  int32_t worker = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  ItemRefs items;  // in matrix order
  // Largest first; counts sum to items.size(). How a worker lays them over
  // the stacks it computes: scheduler/step_schedule.h, OwnerStack.
  BatchParts parts;
  double seconds = 0;  // predicted NS time of the whole batch (all parts)
};

struct OwnershipPlan {
  std::vector<std::string> matrix_names;  // as in the input, in order
  std::vector<std::string> worker_ids;
  // The last `dedicated` workers have no trainer: a replicated matrix they
  // own gets its gradient sent to them (TransferKind::kSendToOwner).
  int32_t dedicated = 0;
  // owners[m][e]: index into worker_ids of the owner of expert e of matrix m
  // (in the first owner group, when there are groups).
  std::vector<ItemOwners> owners;
  // Owner groups: the workers split into groups of one size, each of which
  // owns every matrix among its own members, the same way: the owner in
  // group g is the member of g at the position the first group's owner has
  // in the first group (OwnerGroups). Each group moves gradients and
  // updates among its own members only, and each holds the momentum of
  // every matrix: identical copies, since every group computes from the
  // same gradients with the same kernels. What the coordinator plans across
  // nodes for jobs whose trainers all hold every gradient whole, so that
  // updates never cross a node's network ports. groups[g][s]: the worker
  // index at position s of group g; every worker in exactly one group; no
  // dedicated workers. Empty: one group of every worker.
  std::vector<std::vector<int32_t>> groups;
  // The nodes over which unreduced gradients are summed in two levels
  // (NodeExchange, node_exchange.h) and row_sharded rows relayed
  // (RelaysRows): nodes[k][p] the worker index at position p of node k;
  // every node as many, every worker in exactly one, at least two nodes; no
  // dedicated workers; with owner groups (which never hold unreduced
  // gradients) every node within one group, whose rows it relays. What the
  // coordinator plans where it predicts the shorter step: each bucket's
  // gradients summed within each node, then along each rail (the workers of one
  // position) onto the owner's node, and each matrix's parts then gathered to
  // its owner, instead of a ring reduce over every rank per matrix (and the
  // updates back the reverse way); and the rows of a row_sharded matrix from
  // another node and position through the relay at their position on the
  // owner's node, instead of straight into the owner's own port. Empty:
  // the rings, and rows straight to their owners.
  std::vector<std::vector<int32_t>> exchange_nodes;
  // Same-shape batches, sorted by worker, then shape: the first owner
  // group's (every worker's without groups). Each other group's worker at
  // the same position runs the same batches (OwnerGroups::OwnerIn), so a
  // plan of G groups lists them once, not G times.
  std::vector<Batch> batches;
  // Per worker: predicted seconds (NS + transfers), bytes reserved for owned
  // matrices, fp32 momentum bytes, and bytes over its link per step.
  std::vector<double> worker_seconds;
  std::vector<int64_t> worker_memory_bytes;
  std::vector<int64_t> worker_momentum_bytes;
  std::vector<int64_t> worker_link_bytes;
  double max_seconds = 0;
  double mean_seconds = 0;
  double imbalance = 0;  // max / mean
  // max(total / capacity, largest single matrix), see planner.h.
  double lower_bound = 0;
  // The least Newton-Schulz seconds of every matrix at speed 1
  // (Problem::Work): no plan of workers of total speed S computes them in
  // less than work_seconds / S.
  double work_seconds = 0;
  // Momentum bytes whose owner changed against the previous plan.
  int64_t moved_bytes = 0;
};

// A plan's owner groups, indexed: who owns an item in which group. Built
// from a plan whose groups are valid (CheckOwnerGroups); thread-compatible.
class OwnerGroups {
 public:
  // plan.groups over plan.worker_ids; one group of every worker when the
  // plan has none.
  explicit OwnerGroups(const OwnershipPlan& plan)
      : OwnerGroups(plan.groups, static_cast<int>(plan.worker_ids.size())) {}
  // `groups` (OwnershipPlan::groups) of `workers` workers.
  OwnerGroups(const std::vector<std::vector<int32_t>>& groups, int workers);
  // No workers (count() 0): a plan not yet known.
  OwnerGroups() = default;

  int count() const { return static_cast<int>(members_.size()); }
  // The workers of group g, by position.
  const std::vector<int32_t>& members(int g) const { return members_[g]; }
  // The group of worker `rank`.
  int32_t group_of(int32_t rank) const {
    return grouped_ ? group_of_[rank] : 0;
  }
  // The owner in group g of what `owner` (a member of the first group, as
  // OwnershipPlan::owners names it) owns.
  int32_t OwnerIn(int32_t owner, int g) const {
    return grouped_ ? members_[g][position_[owner]] : owner;
  }
  // Whether `rank` owns, in its own group, what `owner` owns in the first.
  bool Owns(int32_t rank, int32_t owner) const {
    return grouped_ ? OwnerIn(owner, group_of_[rank]) == rank : rank == owner;
  }
  // The member of the first group at `rank`'s position: the worker whose
  // owners and batches (OwnershipPlan) `rank`'s are copies of.
  int32_t InFirstGroup(int32_t rank) const {
    return grouped_ ? members_[0][position_[rank]] : rank;
  }

 private:
  bool grouped_ = false;  // the plan has groups (else one of every worker)
  std::vector<std::vector<int32_t>> members_;
  std::vector<int32_t> group_of_;  // by worker index
  std::vector<int32_t> position_;  // by worker index: within its group
};

// INVALID_ARGUMENT naming plan.groups unless the plan's groups are empty
// or: at least one, all of one size, every worker index in exactly one of
// them, every owner (OwnershipPlan::owners) in the first, no dedicated
// workers.
absl::Status CheckOwnerGroups(const OwnershipPlan& plan);

// INVALID_ARGUMENT naming plan.exchange_nodes unless they are empty or: at
// least two nodes of one size (at least one worker each), every worker
// index in exactly one, no dedicated workers, and with owner groups (valid:
// CheckOwnerGroups first) every node within one group.
absl::Status CheckExchangeNodes(const OwnershipPlan& plan);

// `plan` (of the workers of one group, in the order of `ranks`) made the
// plan of every worker: owners, batches and per-worker figures renumbered
// from positions to `ranks[0]`'s members (the first group), the figures
// copied to every group's member at the same position, worker_ids
// the given `worker_ids` of every rank, moved_bytes counted once per group
// (each moves its own copy). `ranks[g][s]`: the worker index
// (into worker_ids) at position s of group g; each as long as
// plan.worker_ids. With one group of every worker in order, the plan stays
// as it was (groups empty).
OwnershipPlan ReplicateOverGroups(
    OwnershipPlan plan, const std::vector<std::vector<int32_t>>& ranks,
    const std::vector<std::string>& worker_ids);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_PLAN_TYPES_H_
