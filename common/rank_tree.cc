#include "common/rank_tree.h"

#include <algorithm>
#include <cstdint>

namespace muonps {

RankTree::RankTree(int size, int fanout)
    : size_(std::max(size, 1)), fanout_(std::max(fanout, 1)) {}

RankTree RankTree::Star(int size) { return RankTree(size, size - 1); }

int RankTree::Parent(int rank) const {
  return rank <= 0 ? -1 : (rank - 1) / fanout_;
}

std::vector<int> RankTree::Children(int rank) const {
  std::vector<int> children;
  const int64_t first = int64_t{rank} * fanout_ + 1;
  for (int64_t c = first; c < first + fanout_ && c < size_; ++c) {
    children.push_back(static_cast<int>(c));
  }
  return children;
}

bool RankTree::Connects(int a, int b) const {
  if (a < 0 || b < 0 || a >= size_ || b >= size_) return false;
  return Parent(a) == b || Parent(b) == a;
}

std::vector<int> RankTree::Preorder(int rank) const {
  std::vector<int> order;
  std::vector<int> pending = {rank};
  while (!pending.empty()) {
    const int r = pending.back();
    pending.pop_back();
    order.push_back(r);
    const std::vector<int> children = Children(r);
    pending.insert(pending.end(), children.rbegin(), children.rend());
  }
  return order;
}

int RankTree::Toward(int rank, int target) const {
  // Up from `target` until the next step would pass `rank`: a parent's
  // rank is below its children's.
  int t = target;
  while (t > rank && Parent(t) != rank) t = Parent(t);
  return t > rank ? t : Parent(rank);
}

int RankTree::Depth() const {
  int depth = 0;
  for (int r = size_ - 1; r > 0; r = Parent(r)) ++depth;
  return depth;
}

}  // namespace muonps
