#include "scheduler/node_exchange.h"

#include <algorithm>
#include <utility>

namespace muonps {
namespace scheduler {

NodeExchange::NodeExchange(const std::vector<std::vector<int32_t>>& nodes,
                           absl::Span<const int64_t> sizes)
    : nodes_(&nodes) {
  while (halving_ * 2 <= static_cast<int>(nodes.size())) halving_ *= 2;
  offsets_.reserve(sizes.size() + 1);
  offsets_.push_back(0);
  for (const int64_t size : sizes) offsets_.push_back(offsets_.back() + size);
  const int64_t holders = static_cast<int64_t>(halving_) * per_node();
  segment_ = std::max<int64_t>(1, (elements() + holders - 1) / holders);
}

std::vector<ExchangePiece> NodeExchange::Cut(size_t i, int64_t unit,
                                             bool blocks) const {
  std::vector<ExchangePiece> pieces;
  const int64_t begin = offsets_[i];
  const int64_t end = offsets_[i + 1];
  for (int64_t s = begin / unit; s * unit < end; ++s) {
    const int64_t from = std::max(begin, s * unit);
    const int64_t to = std::min(end, (s + 1) * unit);
    ExchangePiece& piece = pieces.emplace_back();
    piece.node = blocks ? -1 : static_cast<int32_t>(s % halving_);
    piece.position = static_cast<int32_t>(blocks ? s : s / halving_);
    piece.in_pack = from;
    piece.in_item = from - begin;
    piece.count = to - from;
  }
  return pieces;
}

std::vector<ExchangePiece> NodeExchange::Pieces(size_t i) const {
  return Cut(i, segment_, /*blocks=*/false);
}

std::vector<ExchangePiece> NodeExchange::Parts(size_t i) const {
  return Cut(i, block(), /*blocks=*/true);
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

float SumAcrossNodes(std::vector<float> parts) {
  int halving = 1;
  while (halving * 2 <= static_cast<int>(parts.size())) halving *= 2;
  for (size_t k = halving; k < parts.size(); ++k) {
    parts[k - halving] = parts[k - halving] + parts[k];
  }
  for (int d = halving / 2; d >= 1; d /= 2) {
    for (int k = 0; k < d; ++k) parts[k] = parts[k] + parts[k + d];
  }
  return parts[0];
}

float SumOverNodes(const std::vector<std::vector<int32_t>>& nodes,
                   absl::FunctionRef<float(int32_t)> part) {
  std::vector<float> sums;
  sums.reserve(nodes.size());
  for (const std::vector<int32_t>& node : nodes) {
    float sum = part(node[0]);
    for (size_t p = 1; p < node.size(); ++p) sum = sum + part(node[p]);
    sums.push_back(sum);
  }
  return SumAcrossNodes(std::move(sums));
}

}  // namespace scheduler
}  // namespace muonps
