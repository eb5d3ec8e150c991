#include "scheduler/node_exchange.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
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

// The relay buffer of `rank` by walking every source of every relayed
// transfer of its group (RelayOf): what ExchangeBuffersOf computes for all
// ranks at once from the members at each position.
int64_t RelayElementsOfOneRank(const StepSchedule& schedule,
                               const std::vector<MatrixSpec>& matrices,
                               int rank, const OwnerGroups& groups, int shards,
                               int update_bytes) {
  const std::vector<std::vector<int32_t>>& nodes = schedule.exchange_nodes;
  const std::vector<NodePosition> at = PositionsOf(nodes);
  const int32_t group = groups.group_of(rank);
  const auto relayed = [&](const Transfer& x, int width) {
    const MatrixSpec& spec = matrices[x.item.matrix];
    if (x.group != group || !RelaysRows(nodes, spec) || rank == x.owner) {
      return int64_t{0};
    }
    const int64_t chunk = (spec.rows + shards - 1) / shards;
    int64_t bytes = 0;
    for (const int32_t r : groups.members(group)) {
      if (r != x.owner && RelayOf(nodes, at, r, x.owner) == rank) {
        bytes += RelayAligned(chunk * spec.cols * width);
      }
    }
    return bytes;
  };
  int64_t most = 0, run = 0;
  for (const Phase& phase : schedule.order) {
    if (phase.kind != PhaseKind::kFromOwners) run = 0;
    if (phase.kind == PhaseKind::kToOwners) {
      int64_t in = 0;
      for (const Transfer& x : schedule.buckets[phase.index].to_owners) {
        if (x.kind == TransferKind::kGatherToOwner) in += relayed(x, 4);
      }
      most = std::max(most, in);
    } else if (phase.kind == PhaseKind::kFromOwners) {
      for (const Transfer& x : schedule.buckets[phase.index].from_owners) {
        if (x.kind == TransferKind::kScatterFromOwner) {
          run += relayed(x, update_bytes);
        }
      }
      most = std::max(most, run);
    }
  }
  return std::max<int64_t>(1, (most + 3) / 4);
}

// Random schedules on M nodes of G workers (positions out of rank order),
// with and without owner groups of whole nodes: every rank's relay buffer
// is the walk over its sources', and the exchange's buffers hold the
// largest bucket of unreduced gradients, as many as are in flight.
TEST(NodeExchangeTest, BuffersHoldWhatEveryRankRelaysAndTheBucketsInFlight) {
  std::mt19937 random(7);
  int relaying = 0;  // rounds in which some rank relays rows
  for (int round = 0; round < 200; ++round) {
    const int m = 2 + static_cast<int>(random() % 4);
    const int g = 1 + static_cast<int>(random() % 4);
    const int workers = m * g;
    std::vector<int32_t> ranks(workers);
    for (int r = 0; r < workers; ++r) ranks[r] = r;
    std::shuffle(ranks.begin(), ranks.end(), random);
    StepSchedule schedule;
    schedule.exchange_nodes.assign(m, {});
    for (int r = 0; r < workers; ++r) {
      schedule.exchange_nodes[r / g].push_back(ranks[r]);
    }
    // Groups of whole nodes: one or two nodes each, or none.
    std::vector<std::vector<int32_t>> grouping;
    if (round % 3 == 1 && m % 2 == 0) {
      for (int k = 0; k < m; k += 2) {
        std::vector<int32_t>& members = grouping.emplace_back();
        for (int j = k; j < k + 2; ++j) {
          for (const int32_t r : schedule.exchange_nodes[j]) {
            members.push_back(r);
          }
        }
        std::sort(members.begin(), members.end());
      }
    }
    const OwnerGroups groups(grouping, workers);
    std::vector<MatrixSpec> matrices(6);
    for (MatrixSpec& spec : matrices) {
      spec.rows = 1 + static_cast<int64_t>(random() % 300);
      spec.cols = 1 + static_cast<int64_t>(random() % 50);
      spec.layout =
          random() % 4 == 0 ? Layout::kUnreduced : Layout::kRowSharded;
      spec.shard_experts = random() % 5 == 0;
    }
    const int buckets = 1 + static_cast<int>(random() % 4);
    int exchanged = 0;
    for (int b = 0; b < buckets; ++b) {
      Bucket& bucket = schedule.buckets.emplace_back();
      for (int i = 0; i < 3; ++i) {
        const int32_t matrix = static_cast<int32_t>(random() % 6);
        Transfer x;
        x.item = {matrix, 0};
        x.group = groups.count() > 1
                      ? static_cast<int32_t>(random() % groups.count())
                      : 0;
        const std::vector<int32_t>& members = groups.members(x.group);
        x.owner = members[random() % members.size()];
        const bool unreduced = matrices[matrix].layout == Layout::kUnreduced;
        x.kind = unreduced ? TransferKind::kExchangeToOwner
                           : TransferKind::kGatherToOwner;
        bucket.to_owners.push_back(x);
        x.kind = unreduced ? TransferKind::kExchangeFromOwner
                           : TransferKind::kScatterFromOwner;
        bucket.from_owners.push_back(x);
      }
      const bool any =
          std::any_of(bucket.to_owners.begin(), bucket.to_owners.end(),
                      [](const Transfer& x) {
                        return x.kind == TransferKind::kExchangeToOwner;
                      });
      exchanged += any ? 1 : 0;
      schedule.order.push_back({PhaseKind::kToOwners, b});
    }
    // The updates back in runs, some after later gradients.
    for (int b = 0; b < buckets; ++b) {
      schedule.order.push_back({PhaseKind::kFromOwners, b});
      if (random() % 3 == 0)
        schedule.order.push_back({PhaseKind::kToOwners, 0});
    }
    const int shards = groups.count() > 1 ? workers / groups.count() : workers;
    const int update_bytes = round % 2 == 0 ? 2 : 4;
    const ExchangeBuffers buffers = ExchangeBuffersOf(
        schedule, matrices, workers, groups, shards, update_bytes);
    ASSERT_EQ(buffers.relay.size(), static_cast<size_t>(workers));
    for (int r = 0; r < workers; ++r) {
      EXPECT_EQ(buffers.relay[r],
                RelayElementsOfOneRank(schedule, matrices, r, groups, shards,
                                       update_bytes))
          << "round " << round << ", rank " << r;
    }
    relaying +=
        *std::max_element(buffers.relay.begin(), buffers.relay.end()) > 1;
    EXPECT_EQ(buffers.slots, std::min(exchanged, kExchangeSteps));
    int64_t packed = 1;
    for (const Bucket& bucket : schedule.buckets) {
      std::vector<int64_t> sizes;
      for (const Transfer& x : bucket.to_owners) {
        if (x.kind != TransferKind::kExchangeToOwner) continue;
        sizes.push_back(matrices[x.item.matrix].rows *
                        matrices[x.item.matrix].cols);
      }
      if (!sizes.empty()) {
        packed = std::max(
            packed, NodeExchange(schedule.exchange_nodes, sizes).packed());
      }
    }
    EXPECT_EQ(buffers.packed, packed);
    EXPECT_EQ(buffers.Bytes(0),
              4 * (buffers.slots * (buffers.packed + buffers.parts) +
                   buffers.relay[0]));
  }
  EXPECT_GT(relaying, 50);
}

// Without exchange nodes nothing is set aside but a relay's one element.
TEST(NodeExchangeTest, NoBuffersWithoutExchangeNodes) {
  const ExchangeBuffers buffers =
      ExchangeBuffersOf(StepSchedule{}, {}, 3, OwnerGroups({}, 3), 3, 2);
  EXPECT_EQ(buffers.slots, 0);
  EXPECT_EQ(buffers.relay, (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(buffers.Bytes(1), 4);
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
