// The layout of one bucket's two-level exchange (OwnershipPlan::
// exchange_nodes): where each worker's part of the bucket's unreduced
// gradients is summed, and where each matrix's sum is then picked up by its
// owner. Pure arithmetic over the plan; the worker moves the bytes
// (server/worker/node_exchange_transfers.h), the clock prices them
// (step_clock.h).
//
// The bucket's exchanged items (TransferKind::kExchangeToOwner, in the
// bucket's order) are packed one after another, padded to `packed()`
// elements, and cut into per_node() blocks of block() elements: block p is
// the one the worker at position p of every node sums. The gradients are
// summed in two levels, each matrix's sum ending on its owner:
// 1. Within each node: the worker at position p receives block p from every
//    other worker of its node and sums the node's parts in position order,
//    left to right (fp32).
// 2. Across the nodes, along each rail (the workers at one position of
//    every node, transport::Split::kRails): each item's part of block p is
//    reduced onto the worker at position p of the item's owner's node, the
//    nodes' sums added left to right in node order (a ring on NCCL, in
//    NCCL's order). So every element of a matrix crosses the network once,
//    spread over the G ports of each node as a ring over every rank spreads
//    it, but a ring's fill is (M - 1) + (G - 1) hops instead of N - 1.
// 3. Within the owner's node, the worker at each block's position sends
//    the item's part of its block to the owner.
// So each element of the sum is, with P_k node k's sum,
// (...((P_0 + P_1) + P_2) ...) + P_{M-1}: SumOverNodes below, the same
// bits on every transport that adds in the order it is given (TCP, CUDA
// IPC). Updates go back the reverse way: the owner sends each block's part
// to the worker at that position on its node, each rail broadcasts it from
// there to every node, and every block goes to the node's other positions.
// Thread-compatible.
#ifndef MUONPS_SCHEDULER_NODE_EXCHANGE_H_
#define MUONPS_SCHEDULER_NODE_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace scheduler {

// The part of an item that lies in one block (NodeExchange::Parts).
struct ExchangePart {
  int32_t position = 0;  // the block's
  int64_t in_pack = 0;   // first element, within the pack
  int64_t in_item = 0;   // first element, within the item
  int64_t count = 0;
};

class NodeExchange {
 public:
  // Blocks are rounded up to a multiple of this many elements, so that
  // every block starts 256-byte aligned in an aligned pack.
  static constexpr int64_t kBlockAlignment = 64;

  // `nodes`: OwnershipPlan::exchange_nodes (checked: CheckExchangeNodes);
  // `sizes`: the exchanged items' elements, in the bucket's order.
  NodeExchange(const std::vector<std::vector<int32_t>>& nodes,
               absl::Span<const int64_t> sizes);

  int nodes() const { return static_cast<int>(nodes_->size()); }
  int per_node() const { return static_cast<int>((*nodes_)[0].size()); }
  int64_t block() const { return block_; }
  // Elements of the padded pack: per_node() blocks.
  int64_t packed() const { return block_ * per_node(); }
  // Elements of the items (the pack before padding).
  int64_t elements() const { return offsets_.back(); }
  // First element of item i in the pack.
  int64_t offset(size_t i) const { return offsets_[i]; }
  // The worker at position p of node k.
  int32_t worker(int k, int p) const { return (*nodes_)[k][p]; }
  // The parts of item i, by block.
  std::vector<ExchangePart> Parts(size_t i) const;

 private:
  const std::vector<std::vector<int32_t>>* nodes_;
  int64_t block_ = kBlockAlignment;
  std::vector<int64_t> offsets_;  // items' first elements, then the total
};

// Where each worker is among `nodes` (OwnershipPlan::exchange_nodes), by
// worker index: `workers` entries (at least every index the nodes name),
// {-1, -1} for a worker on none.
struct NodePosition {
  int node = -1;
  int position = -1;
};
std::vector<NodePosition> PositionsOf(
    const std::vector<std::vector<int32_t>>& nodes, int workers = 0);

// The rails of `nodes`: rail p lists the worker at position p of every
// node, in node order (the order its reduce adds the nodes' sums in).
std::vector<std::vector<int>> RailsOf(
    const std::vector<std::vector<int32_t>>& nodes);

// Whether the rows of `spec` go through relays in a plan with `nodes` (its
// exchange nodes; empty: none): a row_sharded matrix sharded by rows (not
// whole experts). Its gradient's rows (kGatherToOwner) then reach the owner
// in two launches: a rank's rows go straight to the owner where the rank is
// on the owner's node or at the owner's position of another node (on the
// owner's rail); the others cross the network on their own rail to the
// relay, the worker at their position on the owner's node (RelayOf), which
// passes them on to the owner over the node's links in the second launch.
// So a matrix's rows enter the owner's node through every port of that
// node, not the owner's alone. Its update's rows (kScatterFromOwner) go
// back the reverse way. Rows are copied, never added.
bool RelaysRows(const std::vector<std::vector<int32_t>>& nodes,
                const MatrixSpec& spec);

// Whether a plan with `nodes` (its exchange nodes) sums some of `matrices`
// over them: some matrix is unreduced. Only then do its workers form the
// rails and pipeline the exchange (relayed rows go point to point).
bool SumsOverNodes(const std::vector<std::vector<int32_t>>& nodes,
                   const std::vector<MatrixSpec>& matrices);

// The rank through which `source`'s rows reach `owner` (and its update's
// rows come back): `owner` itself where they go straight (RelaysRows).
// `at`: PositionsOf(nodes), naming both.
int RelayOf(const std::vector<std::vector<int32_t>>& nodes,
            const std::vector<NodePosition>& at, int source, int owner);

// The launches of one bucket's exchange, each way: within the node, along
// the rails, within the owner's node. The workers keep at most this many
// buckets' exchanges in flight (one step of each a launch).
inline constexpr int kExchangeSteps = 3;

// Relayed rows are placed in a relay's buffer at this alignment: `bytes`
// rounded up to it.
inline constexpr int64_t kRelayAlignment = 256;
int64_t RelayAligned(int64_t bytes);

// What each worker of a plan with exchange nodes allocates for them when it
// installs the plan, beside its owned matrices (OwnedBytes) and its
// Newton-Schulz workspace (PlanOptions::workspace_bytes):
// - the exchange's buffers, the same on every rank: `slots` buckets of
//   unreduced gradients in flight at once (at most kExchangeSteps), each a
//   pack of `packed` fp32 elements (the largest such bucket's, padded:
//   NodeExchange::packed) and `parts` more (its per_node() - 1 blocks);
// - the relay buffer, `relay[rank]` fp32 elements (at least 1): the most
//   of one bucket's gradient rows, or of one run of updates-back phases'
//   update rows (consecutive in the order: the worker forwards a run's at
//   once), relayed through `rank` (RelaysRows, RelayOf).
struct ExchangeBuffers {
  int slots = 0;
  int64_t packed = 1;
  int64_t parts = 1;
  std::vector<int64_t> relay;  // by rank

  // Bytes of both on `rank`.
  int64_t Bytes(int rank) const;
};

// ExchangeBuffers for `schedule` (with its exchange_nodes; none: no slots
// and a relay of 1 element on each rank) of `matrices` among `workers`
// ranks in owner groups `groups` (each node within one group), each
// trainer holding at most one of `shards` TrainerRowRanges of a relayed
// matrix, the updates `update_bytes` an element. O(transfers x node size).
ExchangeBuffers ExchangeBuffersOf(const StepSchedule& schedule,
                                  const std::vector<MatrixSpec>& matrices,
                                  int workers, const OwnerGroups& groups,
                                  int shards, int update_bytes);

// The sum of one element over every worker of `nodes`, `part(w)` being
// worker w's, as the exchange adds them: each node's parts left to right in
// position order, then the nodes' sums left to right in node order. What a
// single-process replay of the exchange adds.
float SumOverNodes(const std::vector<std::vector<int32_t>>& nodes,
                   absl::FunctionRef<float(int32_t)> part);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_NODE_EXCHANGE_H_
