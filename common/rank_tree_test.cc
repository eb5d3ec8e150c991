#include "common/rank_tree.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace muonps {
namespace {

TEST(RankTreeTest, ChildrenFollowTheirParentByFanout) {
  const RankTree tree(10, 3);
  EXPECT_EQ(tree.Parent(0), -1);
  EXPECT_EQ(tree.Children(0), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(tree.Children(2), (std::vector<int>{7, 8, 9}));
  EXPECT_TRUE(tree.Children(3).empty());
  for (int r = 1; r < 10; ++r) {
    const std::vector<int> siblings = tree.Children(tree.Parent(r));
    EXPECT_NE(std::find(siblings.begin(), siblings.end(), r), siblings.end())
        << r;
    EXPECT_TRUE(tree.Connects(r, tree.Parent(r)));
    EXPECT_TRUE(tree.Connects(tree.Parent(r), r));
  }
  EXPECT_FALSE(tree.Connects(1, 2));
  EXPECT_FALSE(tree.Connects(0, 4));
  EXPECT_FALSE(tree.Connects(0, 10));
  EXPECT_EQ(tree.Depth(), 2);
}

TEST(RankTreeTest, AStarIsOneHop) {
  const RankTree star = RankTree::Star(6);
  EXPECT_EQ(star.Children(0), (std::vector<int>{1, 2, 3, 4, 5}));
  EXPECT_EQ(star.Depth(), 1);
  EXPECT_EQ(star.Toward(3, 5), 0);
  EXPECT_EQ(star.Toward(0, 5), 5);
  EXPECT_EQ(RankTree::Star(1).Depth(), 0);
  EXPECT_TRUE(RankTree::Star(1).Children(0).empty());
}

TEST(RankTreeTest, PreorderListsEachSubtreeOnce) {
  for (int size = 1; size <= 40; ++size) {
    for (int fanout = 1; fanout <= 5; ++fanout) {
      const RankTree tree(size, fanout);
      std::vector<int> all = tree.Preorder(0);
      ASSERT_EQ(static_cast<int>(all.size()), size);
      std::sort(all.begin(), all.end());
      for (int r = 0; r < size; ++r) EXPECT_EQ(all[r], r);
      // A rank's preorder is itself, then its children's preorders.
      for (int r = 0; r < size; ++r) {
        std::vector<int> expected = {r};
        for (const int c : tree.Children(r)) {
          const std::vector<int> sub = tree.Preorder(c);
          expected.insert(expected.end(), sub.begin(), sub.end());
        }
        EXPECT_EQ(tree.Preorder(r), expected) << size << " " << fanout;
      }
    }
  }
}

TEST(RankTreeTest, TowardWalksThePathOneNeighborAtATime) {
  for (int size = 2; size <= 30; ++size) {
    for (int fanout = 1; fanout <= 4; ++fanout) {
      const RankTree tree(size, fanout);
      for (int from = 0; from < size; ++from) {
        for (int to = 0; to < size; ++to) {
          if (from == to) continue;
          int at = from, hops = 0;
          while (at != to && hops <= 2 * tree.Depth()) {
            const int next = tree.Toward(at, to);
            ASSERT_TRUE(tree.Connects(at, next)) << at << " -> " << next;
            at = next;
            ++hops;
          }
          EXPECT_EQ(at, to) << "size " << size << " fanout " << fanout;
        }
      }
    }
  }
}

TEST(RankTreeTest, DepthGrowsWithTheLogarithmOfTheRanks) {
  EXPECT_EQ(RankTree(17, 16).Depth(), 1);
  EXPECT_EQ(RankTree(18, 16).Depth(), 2);
  EXPECT_EQ(RankTree(1024, 16).Depth(), 3);
  EXPECT_EQ(RankTree(5, 1).Depth(), 4);
}

}  // namespace
}  // namespace muonps
