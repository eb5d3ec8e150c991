// Rows relayed across nodes over real TCP ranks (threads of this process):
// every owner stages every rank's rows where they belong, and every rank
// lands its rows of every update, for nodes in and out of rank order,
// uneven row splits, several items of one bucket and fp32 and bf16 updates.
#include "server/worker/row_relay.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/dtype.h"
#include "common/row_ranges.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "scheduler/node_exchange.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

float Value(int64_t matrix, int64_t row, int64_t col) {
  return std::sin(0.37f * static_cast<float>(row * 31 + col) +
                  1.1f * static_cast<float>(matrix));
}

struct Case {
  int nodes;
  int per_node;
  bool rank_order;  // node k holds ranks k*G .. ; else k, k + M, ...
  DType dtype;
};

class RowRelayTest : public ::testing::TestWithParam<Case> {};

TEST_P(RowRelayTest, OwnersStageEveryRowAndRanksLandTheirRowsBack) {
  const Case& c = GetParam();
  const int world = c.nodes * c.per_node;
  std::vector<std::vector<int32_t>> nodes(c.nodes);
  for (int r = 0; r < world; ++r) {
    nodes[c.rank_order ? r / c.per_node : r % c.nodes].push_back(r);
  }
  const std::vector<scheduler::NodePosition> at = scheduler::PositionsOf(nodes);
  // Three matrices of one bucket, rows not a multiple of the ranks, each
  // owned by another rank; trainer r steps with rank r, but for a
  // permutation (the roster's).
  std::vector<scheduler::MatrixSpec> matrices(3);
  const int64_t rows[3] = {13, 2 * world + 1, 5};
  for (int m = 0; m < 3; ++m) {
    matrices[m].name = "m" + std::to_string(m);
    matrices[m].rows = rows[m];
    matrices[m].cols = 7;
    matrices[m].layout = scheduler::Layout::kRowSharded;
  }
  const int owners[3] = {world - 1, 1, c.per_node};
  std::vector<int32_t> members(world);
  for (int r = 0; r < world; ++r) members[r] = r;
  std::vector<int32_t> trainer_rank_of(world);
  for (int r = 0; r < world; ++r) trainer_rank_of[r] = (r + 2) % world;
  const RowRelay::PartOf part_of = [&](const scheduler::MatrixSpec& spec,
                                       int64_t expert, int trainer) {
    return ShardPartOfExpert(spec.rows, spec.experts, spec.shard_experts,
                             expert, trainer, world);
  };
  scheduler::StepSchedule schedule;
  schedule.exchange_nodes = nodes;
  scheduler::Bucket& bucket = schedule.buckets.emplace_back();
  schedule.order = {{scheduler::PhaseKind::kToOwners, 0},
                    {scheduler::PhaseKind::kFromOwners, 0}};
  for (int m = 0; m < 3; ++m) {
    scheduler::Transfer to;
    to.kind = scheduler::TransferKind::kGatherToOwner;
    to.item = {m, 0};
    to.owner = owners[m];
    bucket.to_owners.push_back(to);
    scheduler::Transfer from = to;
    from.kind = scheduler::TransferKind::kScatterFromOwner;
    bucket.from_owners.push_back(from);
  }
  auto transports =
      transport::ConnectLoopbackWorld(world, 11, transport::LoopbackOptions());
  ASSERT_TRUE(transports.ok()) << transports.status();
  const int64_t width = static_cast<int64_t>(DTypeSize(c.dtype));
  // By rank and matrix: what the owner staged, and the rows landed.
  std::vector<std::vector<std::vector<float>>> staged(
      world, std::vector<std::vector<float>>(3));
  std::vector<std::vector<std::vector<char>>> landed(
      world, std::vector<std::vector<char>>(3));
  std::vector<absl::Status> status(world);
  transport::RunOnEveryRank(world, [&](int rank) {
    kernels::CpuDeviceOps ops;
    transport::Transport& t = *(*transports)[rank];
    const int64_t elements =
        scheduler::ExchangeBuffersOf(schedule, matrices, world,
                                     scheduler::OwnerGroups({}, world), world,
                                     static_cast<int>(width))
            .relay[rank];
    std::vector<float> buffer(elements);
    std::vector<std::vector<float>> grads(3);
    std::vector<std::vector<char>> updates(3);
    absl::Status s;
    RowRelay gather(nodes, at, rank, members, trainer_rank_of, part_of, t,
                    buffer.data(), elements * 4, kHostStream);
    int64_t bytes = 0;
    s = t.GroupStart();
    for (int m = 0; m < 3 && s.ok(); ++m) {
      const scheduler::MatrixSpec& spec = matrices[m];
      const ExpertPart part = part_of(spec, 0, trainer_rank_of[rank]);
      for (int64_t row = part.row_begin; row < part.row_end; ++row) {
        for (int64_t col = 0; col < spec.cols; ++col) {
          grads[m].push_back(Value(m, row, col));
        }
      }
      float* into = nullptr;
      if (rank == owners[m]) {
        staged[rank][m].assign(spec.rows * spec.cols, -1.0f);
        into = staged[rank][m].data();
        if (!grads[m].empty()) {
          std::memcpy(into + part.row_begin * spec.cols, grads[m].data(),
                      grads[m].size() * 4);
        }
      }
      s = gather.Gather(spec, 0, owners[m],
                        grads[m].empty() ? nullptr : grads[m].data(), into,
                        &bytes);
    }
    if (s.ok()) s = t.GroupEnd();
    if (s.ok()) s = gather.Forward(&bytes);
    // The updates: the owner's staged matrix, in the dtype, back.
    RowRelay scatter(nodes, at, rank, members, trainer_rank_of, part_of, t,
                     buffer.data(), elements * 4, kHostStream);
    if (s.ok()) s = t.GroupStart();
    for (int m = 0; m < 3 && s.ok(); ++m) {
      const scheduler::MatrixSpec& spec = matrices[m];
      const ExpertPart part = part_of(spec, 0, trainer_rank_of[rank]);
      if (rank == owners[m]) {
        updates[m].resize(spec.rows * spec.cols * width);
        s = ops.FromFloat(updates[m].data(), c.dtype, staged[rank][m].data(),
                          spec.rows * spec.cols, kHostStream);
        if (!s.ok()) break;
      }
      void* landing = nullptr;
      if (rank != owners[m] && part.rows() > 0) {
        landed[rank][m].assign(part.rows() * spec.cols * width, 0);
        landing = landed[rank][m].data();
      }
      s = scatter.Scatter(spec, 0, owners[m], c.dtype,
                          rank == owners[m] ? updates[m].data() : nullptr,
                          landing, &bytes);
    }
    if (s.ok()) s = t.GroupEnd();
    if (s.ok()) s = scatter.Forward(&bytes);
    status[rank] = s;
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  for (int m = 0; m < 3; ++m) {
    const scheduler::MatrixSpec& spec = matrices[m];
    const std::vector<float>& got = staged[owners[m]][m];
    ASSERT_EQ(got.size(), static_cast<size_t>(spec.rows * spec.cols));
    for (int64_t row = 0; row < spec.rows; ++row) {
      for (int64_t col = 0; col < spec.cols; ++col) {
        ASSERT_EQ(got[row * spec.cols + col], Value(m, row, col))
            << spec.name << " row " << row << " col " << col;
      }
    }
    std::vector<char> whole(spec.rows * spec.cols * width);
    kernels::CpuDeviceOps ops;
    ASSERT_TRUE(ops.FromFloat(whole.data(), c.dtype, got.data(),
                              spec.rows * spec.cols, kHostStream)
                    .ok());
    for (int r = 0; r < world; ++r) {
      if (r == owners[m]) continue;
      const ExpertPart part = part_of(spec, 0, trainer_rank_of[r]);
      if (part.rows() == 0) continue;
      ASSERT_EQ(landed[r][m].size(),
                static_cast<size_t>(part.rows() * spec.cols * width));
      EXPECT_EQ(std::memcmp(landed[r][m].data(),
                            whole.data() + part.row_begin * spec.cols * width,
                            landed[r][m].size()),
                0)
          << spec.name << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, RowRelayTest,
                         ::testing::Values(Case{2, 3, true, DType::kFloat32},
                                           Case{3, 2, false, DType::kBFloat16},
                                           Case{4, 2, true, DType::kBFloat16},
                                           Case{2, 1, true, DType::kFloat32}));

}  // namespace
}  // namespace worker
}  // namespace muonps
