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

}  // namespace scheduler
}  // namespace muonps
