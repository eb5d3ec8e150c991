#include "scheduler/node_exchange.h"

#include <algorithm>

namespace muonps {
namespace scheduler {

NodeExchange::NodeExchange(const std::vector<std::vector<int32_t>>& nodes,
                           absl::Span<const int64_t> sizes)
    : nodes_(&nodes) {
  offsets_.reserve(sizes.size() + 1);
  offsets_.push_back(0);
  for (const int64_t size : sizes) offsets_.push_back(offsets_.back() + size);
  const int64_t g = per_node();
  const int64_t a = kBlockAlignment;
  block_ = std::max<int64_t>(1, ((elements() + g - 1) / g + a - 1) / a) * a;
}

std::vector<ExchangePart> NodeExchange::Parts(size_t i) const {
  std::vector<ExchangePart> parts;
  const int64_t begin = offsets_[i];
  const int64_t end = offsets_[i + 1];
  for (int64_t p = begin / block_; p * block_ < end; ++p) {
    const int64_t from = std::max(begin, p * block_);
    const int64_t to = std::min(end, (p + 1) * block_);
    parts.push_back({static_cast<int32_t>(p), from, from - begin, to - from});
  }
  return parts;
}

std::vector<NodePosition> PositionsOf(
    const std::vector<std::vector<int32_t>>& nodes, int workers) {
  for (const std::vector<int32_t>& node : nodes) {
    for (const int32_t r : node) workers = std::max(workers, r + 1);
  }
  std::vector<NodePosition> at(workers);
  for (size_t k = 0; k < nodes.size(); ++k) {
    for (size_t p = 0; p < nodes[k].size(); ++p) {
      at[nodes[k][p]] = {static_cast<int>(k), static_cast<int>(p)};
    }
  }
  return at;
}

std::vector<std::vector<int>> RailsOf(
    const std::vector<std::vector<int32_t>>& nodes) {
  std::vector<std::vector<int>> rails(nodes.empty() ? 0 : nodes[0].size());
  for (size_t p = 0; p < rails.size(); ++p) {
    rails[p].reserve(nodes.size());
    for (const std::vector<int32_t>& node : nodes) rails[p].push_back(node[p]);
  }
  return rails;
}

float SumOverNodes(const std::vector<std::vector<int32_t>>& nodes,
                   absl::FunctionRef<float(int32_t)> part) {
  float total = 0;
  for (size_t k = 0; k < nodes.size(); ++k) {
    float sum = part(nodes[k][0]);
    for (size_t p = 1; p < nodes[k].size(); ++p) sum = sum + part(nodes[k][p]);
    total = k == 0 ? sum : total + sum;
  }
  return total;
}

bool RelaysRows(const std::vector<std::vector<int32_t>>& nodes,
                const MatrixSpec& spec) {
  return !nodes.empty() && spec.layout == Layout::kRowSharded &&
         !spec.shard_experts;
}

bool SumsOverNodes(const std::vector<std::vector<int32_t>>& nodes,
                   const std::vector<MatrixSpec>& matrices) {
  return !nodes.empty() &&
         std::any_of(matrices.begin(), matrices.end(), [](const MatrixSpec& m) {
           return m.layout == Layout::kUnreduced;
         });
}

int RelayOf(const std::vector<std::vector<int32_t>>& nodes,
            const std::vector<NodePosition>& at, int source, int owner) {
  const NodePosition& s = at[source];
  const NodePosition& o = at[owner];
  if (s.node == o.node || s.position == o.position) return owner;
  return nodes[o.node][s.position];
}

int64_t RelayAligned(int64_t bytes) {
  return (bytes + kRelayAlignment - 1) / kRelayAlignment * kRelayAlignment;
}

int64_t ExchangeBuffers::Bytes(int rank) const {
  const int64_t relayed =
      rank >= 0 && rank < static_cast<int>(relay.size()) ? relay[rank] : 0;
  return static_cast<int64_t>(sizeof(float)) *
         (slots * (packed + parts) + relayed);
}

ExchangeBuffers ExchangeBuffersOf(const StepSchedule& schedule,
                                  const std::vector<MatrixSpec>& matrices,
                                  int workers, const OwnerGroups& groups,
                                  int shards, int update_bytes) {
  ExchangeBuffers out;
  out.relay.assign(std::max(workers, 0), 1);
  const std::vector<std::vector<int32_t>>& nodes = schedule.exchange_nodes;
  if (nodes.empty()) return out;
  int buckets = 0;
  for (const Bucket& bucket : schedule.buckets) {
    std::vector<int64_t> sizes;
    for (const Transfer& x : bucket.to_owners) {
      if (x.kind != TransferKind::kExchangeToOwner) continue;
      const MatrixSpec& spec = matrices[x.item.matrix];
      sizes.push_back(spec.rows * spec.cols);
    }
    if (sizes.empty()) continue;
    ++buckets;
    const NodeExchange x(nodes, sizes);
    out.packed = std::max(out.packed, x.packed());
    out.parts = std::max(out.parts, x.block() * (x.per_node() - 1));
  }
  out.slots = std::min(buckets, kExchangeSteps);
  if (shards < 1) return out;
  const std::vector<NodePosition> at = PositionsOf(nodes, workers);
  // The members of each group at each position: the rows of a matrix its
  // owner's node relays at position p come from those not on that node.
  size_t positions = 0;
  for (const std::vector<int32_t>& node : nodes) {
    positions = std::max(positions, node.size());
  }
  std::vector<std::vector<int64_t>> at_position(
      groups.count(), std::vector<int64_t>(positions, 0));
  for (int g = 0; g < groups.count(); ++g) {
    for (const int32_t r : groups.members(g)) {
      if (r < static_cast<int>(at.size()) && at[r].position >= 0) {
        ++at_position[g][at[r].position];
      }
    }
  }
  // Bytes relayed through each rank in the phase (or run) under way.
  std::vector<int64_t> tally(at.size(), 0);
  std::vector<int32_t> touched;
  const auto relayed = [&](const Transfer& x, int width) {
    const MatrixSpec& spec = matrices[x.item.matrix];
    if (!RelaysRows(nodes, spec)) return;
    const NodePosition& o = at[x.owner];
    const int64_t part =
        RelayAligned((spec.rows + shards - 1) / shards * spec.cols * width);
    const std::vector<int32_t>& node = nodes[o.node];
    for (size_t p = 0; p < node.size(); ++p) {
      const int32_t q = node[p];
      if (static_cast<int>(p) == o.position || groups.group_of(q) != x.group) {
        continue;
      }
      // The group's members at position p of every other node (RelayOf).
      const int64_t sources = at_position[x.group][p] - 1;
      if (sources <= 0) continue;
      if (tally[q] == 0) touched.push_back(q);
      tally[q] += sources * part;
    }
  };
  std::vector<int64_t> most(at.size(), 0);
  const auto settle = [&] {
    for (const int32_t q : touched) {
      most[q] = std::max(most[q], tally[q]);
      tally[q] = 0;
    }
    touched.clear();
  };
  for (const Phase& phase : schedule.order) {
    // A bucket's gradients go in a group of their own; a run of updates-back
    // phases (consecutive in the order) in one.
    if (phase.kind != PhaseKind::kFromOwners) settle();
    if (phase.kind == PhaseKind::kToOwners) {
      for (const Transfer& x : schedule.buckets[phase.index].to_owners) {
        if (x.kind == TransferKind::kGatherToOwner) relayed(x, 4);
      }
      settle();
    } else if (phase.kind == PhaseKind::kFromOwners) {
      for (const Transfer& x : schedule.buckets[phase.index].from_owners) {
        if (x.kind == TransferKind::kScatterFromOwner) {
          relayed(x, update_bytes);
        }
      }
    }
  }
  settle();
  for (size_t r = 0; r < at.size() && r < out.relay.size(); ++r) {
    out.relay[r] = std::max<int64_t>(1, (most[r] + 3) / 4);
  }
  return out;
}

}  // namespace scheduler
}  // namespace muonps
