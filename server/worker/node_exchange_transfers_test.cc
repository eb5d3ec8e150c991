// The two-level exchange over real TCP ranks (threads of this process) with
// the CPU ops: every owner's sum has the bits of the replay's association
// (scheduler::SumOverNodes), and every rank lands every update, for nodes
// of one and of several workers, items within one block and across
// several, and several buckets in flight at once.
#include "server/worker/node_exchange_transfers.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <utility>
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
  // Buckets of items (sizes); an empty one joins nothing.
  std::vector<std::vector<int64_t>> buckets;
  DType dtype;
};

class ExchangePipelineTest : public ::testing::TestWithParam<Case> {};

// Every bucket pushed in turn, then drained, each way; every owner's sum
// has the replay's bits and every rank with a trainer lands every update.
TEST_P(ExchangePipelineTest, SumsAsTheReplayAndLandsEveryUpdate) {
  const Case& c = GetParam();
  const int world = c.nodes * c.per_node;
  // Node k holds ranks k, k + nodes, ... : positions not in rank order.
  std::vector<std::vector<int32_t>> nodes(c.nodes);
  for (int r = 0; r < world; ++r) nodes[r % c.nodes].push_back(r);
  auto transports =
      transport::ConnectLoopbackWorld(world, 7, transport::LoopbackOptions());
  ASSERT_TRUE(transports.ok()) << transports.status();
  // Item i of bucket b: its matrix index, and its owner.
  std::vector<std::vector<int32_t>> matrix(c.buckets.size());
  std::vector<int64_t> sizes;
  std::vector<int32_t> owners;
  for (size_t b = 0; b < c.buckets.size(); ++b) {
    for (const int64_t size : c.buckets[b]) {
      matrix[b].push_back(static_cast<int32_t>(sizes.size()));
      owners.push_back((3 * sizes.size() + 1) % world);
      sizes.push_back(size);
    }
  }
  const size_t count = sizes.size();
  const int64_t width = static_cast<int64_t>(DTypeSize(c.dtype));
  std::vector<std::vector<std::vector<float>>> sums(
      world, std::vector<std::vector<float>>(count));
  std::vector<std::vector<std::vector<uint16_t>>> landed(
      world, std::vector<std::vector<uint16_t>>(count));
  std::vector<std::vector<int>> done(world);
  std::vector<absl::Status> status(world);
  transport::RunOnEveryRank(world, [&](int rank) {
    kernels::CpuDeviceOps ops;
    ExchangeState state;
    scheduler::StepSchedule schedule;
    schedule.exchange_nodes = nodes;
    std::vector<scheduler::MatrixSpec> matrices(count);
    for (size_t b = 0; b < c.buckets.size(); ++b) {
      scheduler::Bucket& bucket = schedule.buckets.emplace_back();
      for (const int32_t m : matrix[b]) {
        matrices[m].rows = sizes[m];
        matrices[m].cols = 1;
        scheduler::Transfer x;
        x.kind = scheduler::TransferKind::kExchangeToOwner;
        x.item = {m, 0};
        x.owner = owners[m];
        bucket.to_owners.push_back(x);
      }
    }
    status[rank] = (*transports)[rank]->FormSplit(transport::Split::kRails,
                                                  scheduler::RailsOf(nodes));
    if (!status[rank].ok()) return;
    status[rank] = PrepareExchange(
        schedule,
        scheduler::ExchangeBuffersOf(schedule, matrices, world,
                                     scheduler::OwnerGroups({}, world), world,
                                     static_cast<int>(width)),
        rank, ops, &state);
    if (!status[rank].ok()) return;
    std::vector<std::vector<float>> parts(count);
    std::vector<std::vector<uint16_t>> updates(count);
    const auto items_of = [&](size_t b) {
      std::vector<ExchangeItem> items;
      for (const int32_t m : matrix[b]) {
        ExchangeItem& item = items.emplace_back();
        item.size = sizes[m];
        item.owner = owners[m];
        item.part = parts[m].data();
        if (owners[m] == rank) item.sum = sums[rank][m].data();
        if (owners[m] == rank) item.update = updates[m].data();
        // The last rank has no trainer (with three ranks or more): its
        // updates land nowhere, though it passes them on.
        if (rank != world - 1 || world < 3) {
          item.landing = landed[rank][m].data();
        }
      }
      return items;
    };
    for (size_t m = 0; m < count; ++m) {
      parts[m].resize(sizes[m]);
      for (int64_t e = 0; e < sizes[m]; ++e) parts[m][e] = PartOf(rank, m, e);
      if (owners[m] == rank) sums[rank][m].assign(sizes[m], 0.0f);
      updates[m].assign(sizes[m] * width / 2, 0);
      landed[rank][m].assign(sizes[m] * width / 2, 0xffff);
    }
    int64_t bytes = 0;
    {
      ExchangePipeline sum(nodes, rank, *(*transports)[rank], ops, state,
                           kHostStream, ExchangePipeline::Way::kSum);
      for (size_t b = 0; b < c.buckets.size() && status[rank].ok(); ++b) {
        status[rank] = sum.Push(static_cast<int>(b), items_of(b), &bytes);
        for (const int d : sum.TakeDone()) done[rank].push_back(d);
      }
      if (!status[rank].ok()) return;
      status[rank] = sum.Drain(&bytes);
      for (const int d : sum.TakeDone()) done[rank].push_back(d);
      if (!status[rank].ok()) return;
    }
    // The update: the owner's sum, in the exchange's dtype.
    for (size_t m = 0; m < count; ++m) {
      if (owners[m] != rank) continue;
      FromFloat(c.dtype, sums[rank][m].data(), sizes[m], updates[m].data());
    }
    ExchangePipeline gather(nodes, rank, *(*transports)[rank], ops, state,
                            kHostStream, ExchangePipeline::Way::kGather,
                            c.dtype);
    for (size_t b = 0; b < c.buckets.size() && status[rank].ok(); ++b) {
      status[rank] = gather.Push(static_cast<int>(b), items_of(b), &bytes);
    }
    if (status[rank].ok()) status[rank] = gather.Drain(&bytes);
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  // Buckets with items are done in order, each once.
  std::vector<int> joined;
  for (size_t b = 0; b < c.buckets.size(); ++b) {
    if (!c.buckets[b].empty()) joined.push_back(static_cast<int>(b));
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(done[r], joined) << "rank " << r;
  for (size_t m = 0; m < count; ++m) {
    const std::vector<float>& sum = sums[owners[m]][m];
    for (int64_t e = 0; e < sizes[m]; ++e) {
      const float want = scheduler::SumOverNodes(
          nodes, [&](int32_t r) { return PartOf(r, m, e); });
      ASSERT_EQ(std::memcmp(&sum[e], &want, 4), 0)
          << "item " << m << " element " << e << ": " << sum[e] << " vs "
          << want;
    }
    std::vector<uint16_t> want(sizes[m] * width / 2);
    FromFloat(c.dtype, sum.data(), sizes[m], want.data());
    for (int r = 0; r < world; ++r) {
      if (r == world - 1 && world >= 3) continue;  // no trainer
      EXPECT_EQ(landed[r][m], want) << "item " << m << " on rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ExchangePipelineTest,
    ::testing::Values(
        // Two nodes of two; an item across both blocks.
        Case{2, 2, {{50, 170, 30}}, DType::kFloat32},
        // Three nodes; several buckets in flight at once, one with nothing
        // to exchange.
        Case{3, 2, {{5, 7, 300, 1}, {}, {9}, {2, 200}}, DType::kBFloat16},
        // Four nodes of one: no node level.
        Case{4, 1, {{9, 2}, {4}}, DType::kFloat32},
        // Five nodes of two, items smaller and larger than a block, more
        // buckets than the pipeline's steps.
        Case{5,
             2,
             {{1, 400, 2, 170}, {3}, {80, 80}, {1}, {300}, {6, 1}, {2}, {11}},
             DType::kBFloat16},
        // Three nodes of three: items spanning three blocks.
        Case{3, 3, {{500, 70}, {130}}, DType::kFloat32},
        // Fewer elements than workers.
        Case{2, 3, {{2}}, DType::kFloat32}));

}  // namespace
}  // namespace worker
}  // namespace muonps
