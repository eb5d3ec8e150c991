// The two-level exchange over real TCP ranks (threads of this process) with
// the CPU ops: every owner's sum has the bits of the replay's association
// (position order within a node, then scheduler::SumAcrossNodes), and every
// rank lands every update, for node counts with and without a fold.
#include "server/worker/node_exchange_transfers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

// Values whose sums round differently by association.
float PartOf(int rank, size_t item, int64_t i) {
  const float scale = (rank % 3 == 0) ? 1e8f : (rank % 3 == 1 ? 1.0f : 1e-7f);
  return scale * std::sin(0.37f * static_cast<float>(i + 1) +
                          1.3f * static_cast<float>(rank) +
                          0.11f * static_cast<float>(item));
}

struct Case {
  int nodes;
  int per_node;
  std::vector<int64_t> sizes;
  DType dtype;
};

class NodeExchangeTransfersTest : public ::testing::TestWithParam<Case> {};

TEST_P(NodeExchangeTransfersTest, SumsAsTheReplayAndLandsEveryUpdate) {
  const Case& c = GetParam();
  const int world = c.nodes * c.per_node;
  // Node k holds ranks k, k + nodes, ... : positions not in rank order.
  std::vector<std::vector<int32_t>> nodes(c.nodes);
  for (int r = 0; r < world; ++r) nodes[r % c.nodes].push_back(r);
  auto transports =
      transport::ConnectLoopbackWorld(world, 7, transport::LoopbackOptions());
  ASSERT_TRUE(transports.ok()) << transports.status();
  const size_t count = c.sizes.size();
  std::vector<int32_t> owners(count);
  for (size_t i = 0; i < count; ++i) owners[i] = (3 * i + 1) % world;
  std::vector<std::vector<std::vector<float>>> sums(
      world, std::vector<std::vector<float>>(count));
  std::vector<std::vector<std::vector<uint16_t>>> landed(
      world, std::vector<std::vector<uint16_t>>(count));
  const int64_t width = static_cast<int64_t>(DTypeSize(c.dtype));
  std::vector<absl::Status> status(world);
  transport::RunOnEveryRank(world, [&](int rank) {
    kernels::CpuDeviceOps ops;
    ExchangeState buffers;
    scheduler::StepSchedule schedule;
    schedule.exchange_nodes = nodes;
    std::vector<scheduler::MatrixSpec> matrices;
    scheduler::Bucket& bucket = schedule.buckets.emplace_back();
    for (size_t i = 0; i < count; ++i) {
      scheduler::MatrixSpec& spec = matrices.emplace_back();
      spec.rows = c.sizes[i];
      spec.cols = 1;
      scheduler::Transfer x;
      x.kind = scheduler::TransferKind::kExchangeToOwner;
      x.item = {static_cast<int32_t>(i), 0};
      x.owner = owners[i];
      bucket.to_owners.push_back(x);
    }
    status[rank] = PrepareExchange(schedule, matrices, ops, &buffers);
    if (!status[rank].ok()) return;
    NodeExchangeTransfers exchange(nodes, rank, *(*transports)[rank], ops,
                                   buffers, kHostStream);
    std::vector<std::vector<float>> parts(count);
    std::vector<std::vector<uint16_t>> updates(count);
    std::vector<ExchangeItem> items(count);
    for (size_t i = 0; i < count; ++i) {
      parts[i].resize(c.sizes[i]);
      for (int64_t e = 0; e < c.sizes[i]; ++e) parts[i][e] = PartOf(rank, i, e);
      items[i].size = c.sizes[i];
      items[i].owner = owners[i];
      items[i].part = parts[i].data();
      if (owners[i] == rank) {
        sums[rank][i].assign(c.sizes[i], 0.0f);
        items[i].sum = sums[rank][i].data();
      }
    }
    int64_t bytes = 0;
    status[rank] = exchange.Sum(items, &bytes);
    if (!status[rank].ok()) return;
    for (size_t i = 0; i < count; ++i) {
      // The update: the owner's sum, in the exchange's dtype.
      updates[i].assign(c.sizes[i] * width / 2, 0);
      if (owners[i] == rank) {
        FromFloat(c.dtype, sums[rank][i].data(), c.sizes[i], updates[i].data());
        items[i].update = updates[i].data();
      }
      landed[rank][i].assign(c.sizes[i] * width / 2, 0xffff);
      items[i].landing = landed[rank][i].data();
    }
    status[rank] = exchange.Gather(items, c.dtype, &bytes);
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  for (size_t i = 0; i < count; ++i) {
    const std::vector<float>& sum = sums[owners[i]][i];
    for (int64_t e = 0; e < c.sizes[i]; ++e) {
      std::vector<float> node_sums;
      for (const std::vector<int32_t>& node : nodes) {
        float s = PartOf(node[0], i, e);
        for (size_t p = 1; p < node.size(); ++p) s = s + PartOf(node[p], i, e);
        node_sums.push_back(s);
      }
      const float want = scheduler::SumAcrossNodes(node_sums);
      ASSERT_EQ(std::memcmp(&sum[e], &want, 4), 0)
          << "item " << i << " element " << e << ": " << sum[e] << " vs "
          << want;
    }
    std::vector<uint16_t> want(c.sizes[i] * width / 2);
    FromFloat(c.dtype, sum.data(), c.sizes[i], want.data());
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(landed[r][i], want) << "item " << i << " on rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, NodeExchangeTransfersTest,
    ::testing::Values(
        // Two nodes of two: one halving round.
        Case{2, 2, {5, 7, 3}, DType::kFloat32},
        // Three nodes: node 2 folds into node 0.
        Case{3, 2, {5, 7, 3, 1}, DType::kBFloat16},
        // Four nodes of one: two halving rounds, no node level.
        Case{4, 1, {9, 2}, DType::kFloat32},
        // Five nodes of two, items smaller and larger than a segment.
        Case{5, 2, {1, 40, 2, 17}, DType::kBFloat16},
        // Fewer elements than holders.
        Case{2, 3, {2}, DType::kFloat32}));

}  // namespace
}  // namespace worker
}  // namespace muonps
