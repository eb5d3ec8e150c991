// The layout of one bucket's two-level exchange (OwnershipPlan::
// exchange_nodes): where each worker's part of the bucket's unreduced
// gradients is summed, and where each matrix's sum is then picked up by its
// owner. Pure arithmetic over the plan; the worker moves the bytes
// (server/worker/node_exchange_transfers.h), the clock prices them
// (step_clock.h).
//
// The bucket's exchanged items (TransferKind::kExchangeToOwner, in the
// bucket's order) are packed one after another, padded to `packed()`
// elements, and cut into per_node() blocks of halving_nodes() segments of
// segment() elements each: segment s = p * halving_nodes() + k is block p's
// k-th. The gradients are summed in two levels:
// 1. Within each node: the worker at position p receives block p from every
//    other worker of its node and sums the node's parts in position order,
//    left to right (fp32).
// 2. Across the nodes, among the workers at one position: where the node
//    count M is not a power of two, node k >= M' (M' the largest power of
//    two <= M) first adds its block into node k - M' (a fold); then M'
//    nodes halve recursively, in log2(M') rounds, partners at distance
//    M'/2, then M'/4, ..., 1: each keeps the half of its range holding its
//    own segment and adds its partner's copy of it. Node k < M' ends with
//    the sum of segment k of its block over every node.
// So each element of the sum is, with P_k a node's sum, the pairwise tree
// of SumAcrossNodes below, the same bits on every worker and transport.
// Each matrix's sum then goes to its owner in two hops, so that its bytes
// cross the network spread over the ports of the owner's node, as a ring's
// do, not all through the owner's own: each segment's piece of it goes to
// the worker at the segment's position on the owner's node (over the
// network), and that worker sends the matrix's part of its block on to the
// owner (within the node). Its update goes back the reverse way: each
// block's part to the worker at that position on the owner's node, each
// piece on to its segment's holder, then gathered back in two levels
// (recursive doubling, the fold's nodes sent their block, then every block
// within the node).
// Thread-compatible.
#ifndef MUONPS_SCHEDULER_NODE_EXCHANGE_H_
#define MUONPS_SCHEDULER_NODE_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace muonps {
namespace scheduler {

// A piece of an item: the part one segment holds (NodeExchange::Pieces),
// or one block (NodeExchange::Parts).
struct ExchangePiece {
  int32_t node = 0;      // the segment holder's; -1 for a block
  int32_t position = 0;  // the segment holder's, or the block's
  int64_t in_pack = 0;   // first element, within the pack
  int64_t in_item = 0;   // first element, within the item
  int64_t count = 0;
};

class NodeExchange {
 public:
  // `nodes`: OwnershipPlan::exchange_nodes (checked: CheckExchangeNodes);
  // `sizes`: the exchanged items' elements, in the bucket's order.
  NodeExchange(const std::vector<std::vector<int32_t>>& nodes,
               absl::Span<const int64_t> sizes);

  int nodes() const { return static_cast<int>(nodes_->size()); }
  int per_node() const { return static_cast<int>((*nodes_)[0].size()); }
  // M': the largest power of two <= nodes().
  int halving_nodes() const { return halving_; }
  int64_t segment() const { return segment_; }
  int64_t block() const { return segment_ * halving_; }
  // Elements of the padded pack: per_node() blocks.
  int64_t packed() const { return block() * per_node(); }
  // Elements of the items (the pack before padding).
  int64_t elements() const { return offsets_.back(); }
  // First element of item i in the pack.
  int64_t offset(size_t i) const { return offsets_[i]; }
  // The worker at position p of node k.
  int32_t worker(int k, int p) const { return (*nodes_)[k][p]; }
  // Segment s's holder (worker index).
  int32_t holder(int64_t s) const {
    return worker(static_cast<int>(s % halving_),
                  static_cast<int>(s / halving_));
  }
  // The pieces of item i, by segment.
  std::vector<ExchangePiece> Pieces(size_t i) const;
  // The parts of item i, by block.
  std::vector<ExchangePiece> Parts(size_t i) const;

 private:
  // Item i cut at multiples of `unit` elements of the pack: segments, or
  // blocks.
  std::vector<ExchangePiece> Cut(size_t i, int64_t unit, bool blocks) const;

  const std::vector<std::vector<int32_t>>* nodes_;
  int halving_ = 1;
  int64_t segment_ = 1;
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

// The sum across `parts.size()` nodes' sums of one element, as the exchange
// adds them: the fold, then the pairwise halving tree (see above). What a
// single-process replay of the exchange adds; `parts` is consumed.
float SumAcrossNodes(std::vector<float> parts);

// The sum of one element over every worker of `nodes`, `part(w)` being
// worker w's, as the exchange adds them: each node's parts left to right in
// position order, then SumAcrossNodes of the nodes' sums.
float SumOverNodes(const std::vector<std::vector<int32_t>>& nodes,
                   absl::FunctionRef<float(int32_t)> part);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_NODE_EXCHANGE_H_
