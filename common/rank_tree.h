// RankTree: the ranks of a transport as a tree rooted at rank 0, along which
// a step's control messages pass (worker/step_control.h). Rank r's children
// are r * fanout + 1 ... r * fanout + fanout (those below size), so a
// parent's rank is below its children's and every rank is within
// log_fanout(size) hops of rank 0. With fanout >= size - 1 it is a star:
// rank 0 and every other rank, one hop each.
//
// A gather to rank 0 passes each rank's subtree up as one message, its
// ranks in preorder (Preorder()); a broadcast from any rank passes the
// message on to every neighbor but the one it came from. Each rank then
// exchanges messages with at most fanout + 1 others, so rank 0's share of a
// round grows with the fanout times the depth, not with the ranks.
//
// A value type; thread-compatible.
#ifndef MUONPS_COMMON_RANK_TREE_H_
#define MUONPS_COMMON_RANK_TREE_H_

#include <vector>

namespace muonps {

class RankTree {
 public:
  // `size` ranks (at least 1), `fanout` children a rank at most (at
  // least 1; clamped).
  RankTree(int size, int fanout);
  // Rank 0 with every other rank.
  static RankTree Star(int size);

  int size() const { return size_; }
  int fanout() const { return fanout_; }

  // -1 for rank 0.
  int Parent(int rank) const;
  // Ascending; empty for a leaf.
  std::vector<int> Children(int rank) const;
  // Whether `a` and `b` are parent and child (either way round).
  bool Connects(int a, int b) const;
  // `rank`'s subtree in preorder: itself, then each child's subtree in
  // turn. A gather's message from `rank` to its parent holds one entry
  // per rank in this order.
  std::vector<int> Preorder(int rank) const;
  // The neighbor of `rank` on the path to `target` (another rank).
  int Toward(int rank, int target) const;
  // The most hops from rank 0 to any rank.
  int Depth() const;

 private:
  int size_;
  int fanout_;
};

}  // namespace muonps

#endif  // MUONPS_COMMON_RANK_TREE_H_
