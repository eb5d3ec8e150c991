#include "scheduler/node_exchange.h"

#include <gtest/gtest.h>

#include <vector>

namespace muonps {
namespace scheduler {
namespace {

// Three nodes of two: two rails of three.
const std::vector<std::vector<int32_t>> kNodes = {{0, 1}, {2, 3}, {4, 5}};

TEST(NodeExchangeTest, BlocksCoverThePackAligned) {
  const std::vector<int64_t> sizes = {50, 70, 30};
  const NodeExchange x(kNodes, sizes);
  EXPECT_EQ(x.nodes(), 3);
  EXPECT_EQ(x.per_node(), 2);
  EXPECT_EQ(x.elements(), 150);
  // Two blocks of 75 elements, rounded up to the alignment.
  EXPECT_EQ(x.block(), 128);
  EXPECT_EQ(x.packed(), 256);
  EXPECT_EQ(x.worker(2, 1), 5);
  // Every element of every item in exactly one part, in its block.
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t next = 0;
    for (const ExchangePart& part : x.Parts(i)) {
      EXPECT_EQ(part.in_item, next);
      EXPECT_EQ(part.in_pack, x.offset(i) + part.in_item);
      EXPECT_EQ(part.in_pack / x.block(), part.position);
      EXPECT_LE(part.in_pack + part.count, (part.position + 1) * x.block());
      next += part.count;
    }
    EXPECT_EQ(next, sizes[i]);
  }
  // Item 1 (elements 50..119) lies in block 0; item 2 (120..149) in both.
  ASSERT_EQ(x.Parts(1).size(), 1u);
  const std::vector<ExchangePart> parts = x.Parts(2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].position, 0);
  EXPECT_EQ(parts[0].in_pack, 120);
  EXPECT_EQ(parts[0].count, 8);
  EXPECT_EQ(parts[1].position, 1);
  EXPECT_EQ(parts[1].in_pack, 128);
  EXPECT_EQ(parts[1].in_item, 8);
  EXPECT_EQ(parts[1].count, 22);
}

TEST(NodeExchangeTest, TinyBucketsHaveOneBlockOfTheAlignment) {
  const std::vector<int64_t> sizes = {1};
  const NodeExchange x(kNodes, sizes);
  EXPECT_EQ(x.block(), NodeExchange::kBlockAlignment);
  ASSERT_EQ(x.Parts(0).size(), 1u);
  EXPECT_EQ(x.Parts(0)[0].position, 0);
}

TEST(NodeExchangeTest, RowsGoThroughTheRelayAtTheirPositionOnTheOwnersNode) {
  const std::vector<NodePosition> at = PositionsOf(kNodes);
  // Owner 2 (node 1, position 0).
  EXPECT_EQ(RelayOf(kNodes, at, 3, 2), 2);  // its node: straight
  EXPECT_EQ(RelayOf(kNodes, at, 0, 2), 2);  // its position: straight
  EXPECT_EQ(RelayOf(kNodes, at, 4, 2), 2);
  EXPECT_EQ(RelayOf(kNodes, at, 1, 2), 3);  // position 1 of node 1
  EXPECT_EQ(RelayOf(kNodes, at, 5, 2), 3);
  MatrixSpec spec;
  spec.layout = Layout::kRowSharded;
  EXPECT_TRUE(RelaysRows(kNodes, spec));
  EXPECT_FALSE(RelaysRows({}, spec));
  spec.shard_experts = true;
  EXPECT_FALSE(RelaysRows(kNodes, spec));
  spec.shard_experts = false;
  spec.layout = Layout::kUnreduced;
  EXPECT_FALSE(RelaysRows(kNodes, spec));
}

TEST(NodeExchangeTest, PositionsAndRailsOfWorkers) {
  const std::vector<NodePosition> at = PositionsOf(kNodes, 8);
  ASSERT_EQ(at.size(), 8u);
  EXPECT_EQ(at[3].node, 1);
  EXPECT_EQ(at[3].position, 1);
  EXPECT_EQ(at[4].node, 2);
  EXPECT_EQ(at[7].node, -1);
  EXPECT_EQ(PositionsOf(kNodes).size(), 6u);
  const std::vector<std::vector<int>> rails = RailsOf(kNodes);
  ASSERT_EQ(rails.size(), 2u);
  EXPECT_EQ(rails[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(rails[1], (std::vector<int>{1, 3, 5}));
}

TEST(NodeExchangeTest, SumsEachNodeThenTheNodesLeftToRight) {
  // Values whose sums round differently by association.
  const std::vector<float> v = {1.0f, 1e-8f, -1.0f, 1e-8f, 3e-8f, 1.0f};
  const auto part = [&](int32_t w) { return v[w]; };
  EXPECT_EQ(SumOverNodes(kNodes, part),
            ((v[0] + v[1]) + (v[2] + v[3])) + (v[4] + v[5]));
  // Out of rank order: the nodes' and positions' order, not the ranks'.
  const std::vector<std::vector<int32_t>> shuffled = {{4, 1}, {0, 5}, {2, 3}};
  EXPECT_EQ(SumOverNodes(shuffled, part),
            ((v[4] + v[1]) + (v[0] + v[5])) + (v[2] + v[3]));
  EXPECT_EQ(SumOverNodes({{2}}, part), v[2]);
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
