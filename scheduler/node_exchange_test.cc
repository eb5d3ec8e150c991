#include "scheduler/node_exchange.h"

#include <gtest/gtest.h>

#include <vector>

namespace muonps {
namespace scheduler {
namespace {

// Three nodes of two: one folded into node 0, then two halve.
const std::vector<std::vector<int32_t>> kNodes = {{0, 1}, {2, 3}, {4, 5}};

TEST(NodeExchangeTest, SegmentsCoverThePackAndEachHasOneHolder) {
  const std::vector<int64_t> sizes = {5, 7, 3};
  const NodeExchange x(kNodes, sizes);
  EXPECT_EQ(x.nodes(), 3);
  EXPECT_EQ(x.per_node(), 2);
  EXPECT_EQ(x.halving_nodes(), 2);
  EXPECT_EQ(x.elements(), 15);
  // Four holders (two nodes halving, two positions): segments of 4.
  EXPECT_EQ(x.segment(), 4);
  EXPECT_EQ(x.block(), 8);
  EXPECT_EQ(x.packed(), 16);
  // Segment s = p * 2 + k: block p, node k.
  EXPECT_EQ(x.holder(0), 0);
  EXPECT_EQ(x.holder(1), 2);
  EXPECT_EQ(x.holder(2), 1);
  EXPECT_EQ(x.holder(3), 3);
  // Every element of every item in exactly one piece and one part.
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t next = 0;
    for (const ExchangePiece& piece : x.Pieces(i)) {
      EXPECT_EQ(piece.in_item, next);
      EXPECT_EQ(piece.in_pack, x.offset(i) + piece.in_item);
      const int64_t s = piece.in_pack / x.segment();
      EXPECT_EQ(x.holder(s), x.worker(piece.node, piece.position));
      EXPECT_LE(piece.in_pack + piece.count, (s + 1) * x.segment());
      next += piece.count;
    }
    EXPECT_EQ(next, sizes[i]);
    next = 0;
    for (const ExchangePiece& part : x.Parts(i)) {
      EXPECT_EQ(part.node, -1);
      EXPECT_EQ(part.in_item, next);
      EXPECT_EQ(part.in_pack / x.block(), part.position);
      EXPECT_LE(part.in_pack + part.count, (part.position + 1) * x.block());
      next += part.count;
    }
    EXPECT_EQ(next, sizes[i]);
  }
  // Item 1 (elements 5..11) lies in segments 1 and 2, blocks 0 and 1.
  const std::vector<ExchangePiece> pieces = x.Pieces(1);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(x.worker(pieces[0].node, pieces[0].position), 2);
  EXPECT_EQ(pieces[0].in_pack, 5);
  EXPECT_EQ(pieces[0].count, 3);
  EXPECT_EQ(x.worker(pieces[1].node, pieces[1].position), 1);
  EXPECT_EQ(pieces[1].in_item, 3);
  EXPECT_EQ(pieces[1].count, 4);
  const std::vector<ExchangePiece> parts = x.Parts(1);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].position, 0);
  EXPECT_EQ(parts[0].count, 3);
  EXPECT_EQ(parts[1].position, 1);
  EXPECT_EQ(parts[1].count, 4);
}

TEST(NodeExchangeTest, TinyBucketsHaveSegmentsOfOne) {
  const std::vector<int64_t> sizes = {1};
  const NodeExchange x(kNodes, sizes);
  EXPECT_EQ(x.segment(), 1);
  ASSERT_EQ(x.Pieces(0).size(), 1u);
  EXPECT_EQ(x.Pieces(0)[0].node, 0);
  EXPECT_EQ(x.Pieces(0)[0].position, 0);
}

TEST(NodeExchangeTest, PositionsOfWorkers) {
  const std::vector<NodePosition> at = PositionsOf(kNodes, 8);
  ASSERT_EQ(at.size(), 8u);
  EXPECT_EQ(at[3].node, 1);
  EXPECT_EQ(at[3].position, 1);
  EXPECT_EQ(at[4].node, 2);
  EXPECT_EQ(at[7].node, -1);
  EXPECT_EQ(PositionsOf(kNodes).size(), 6u);
}

TEST(NodeExchangeTest, SumsAcrossNodesFoldThenHalve) {
  // Values whose sums round differently by association.
  const float a = 1.0f, b = 1e-8f, c = -1.0f, d = 1e-8f, e = 3e-8f;
  // Four nodes: (a + c) + (b + d).
  EXPECT_EQ(SumAcrossNodes({a, b, c, d}), (a + c) + (b + d));
  // Five: e folds into a first.
  EXPECT_EQ(SumAcrossNodes({a, b, c, d, e}), ((a + e) + c) + (b + d));
  EXPECT_EQ(SumAcrossNodes({a, b}), a + b);
  EXPECT_EQ(SumAcrossNodes({a}), a);
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
