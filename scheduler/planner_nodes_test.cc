// The planner across nodes (PlanInput::nodes, placement.h's
// SpreadOverNodes): owners dealt over the nodes, each worker's load and
// batches the same as without the nodes, only under another index.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/cost_table.h"
#include "scheduler/plan_test_util.h"
#include "scheduler/planner.h"

namespace muonps {
namespace scheduler {
namespace {

using plan_test::ExpectValidPlan;
using plan_test::kGiB;
using plan_test::kRel;
using plan_test::RandomInput;
using plan_test::Worker;

// `count` row_sharded 4096 x 4096 matrices on `workers` equal workers.
PlanInput EqualMatrices(int count, int workers) {
  PlanInput input;
  for (int m = 0; m < count; ++m) {
    MatrixSpec spec;
    spec.name = absl::StrCat("m", m);
    spec.rows = 4096;
    spec.cols = 4096;
    spec.layout = Layout::kRowSharded;
    input.matrices.push_back(spec);
  }
  for (int w = 0; w < workers; ++w) {
    input.workers.push_back(Worker(absl::StrCat("w", w), 80 * kGiB));
  }
  return input;
}

// Worker w on node w / per_node.
std::vector<int32_t> Blocks(int workers, int per_node) {
  std::vector<int32_t> nodes(workers);
  for (int w = 0; w < workers; ++w) nodes[w] = w / per_node;
  return nodes;
}

// Owned link bytes by node.
std::map<int32_t, int64_t> LinkBytesByNode(const PlanInput& input,
                                           const OwnershipPlan& plan) {
  std::map<int32_t, int64_t> out;
  for (size_t w = 0; w < plan.worker_link_bytes.size(); ++w) {
    out[input.nodes[w]] += plan.worker_link_bytes[w];
  }
  return out;
}

// The per-worker figures as multisets: the same loads, under any index.
void ExpectSameWorkersRelabelled(const OwnershipPlan& a,
                                 const OwnershipPlan& b) {
  const auto sorted = [](std::vector<int64_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(a.worker_link_bytes), sorted(b.worker_link_bytes));
  EXPECT_EQ(sorted(a.worker_memory_bytes), sorted(b.worker_memory_bytes));
  EXPECT_NEAR(a.max_seconds, b.max_seconds, kRel * a.max_seconds);
  EXPECT_EQ(a.batches.size(), b.batches.size());
}

// Four matrices on two nodes of eight: the greedy placement alone puts them
// on workers 0-3, all on the first node; with the nodes known, two on each.
TEST(PlannerNodesTest, OwnersAreDealtOverTheNodes) {
  PlanInput input = EqualMatrices(4, 16);
  const absl::StatusOr<OwnershipPlan> flat = PlanOwnership(input);
  ASSERT_TRUE(flat.ok()) << flat.status();
  input.nodes = Blocks(16, 8);
  const absl::StatusOr<OwnershipPlan> spread = PlanOwnership(input);
  ASSERT_TRUE(spread.ok()) << spread.status();
  ExpectValidPlan(input, *spread);
  ExpectSameWorkersRelabelled(*flat, *spread);
  const std::map<int32_t, int64_t> bytes = LinkBytesByNode(input, *spread);
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes.at(0), bytes.at(1));
  // Each node's owners take its lowest indices, the busiest first.
  std::vector<int32_t> owners;
  for (const ItemOwners& o : spread->owners) owners.push_back(o[0]);
  std::sort(owners.begin(), owners.end());
  EXPECT_EQ(owners, (std::vector<int32_t>{0, 1, 8, 9}));
}

// `input`'s 16 workers planned flat and then on two nodes of eight: the
// same loads relabelled, each node owning as many link bytes.
void ExpectDealtEvenlyOverTwoNodes(PlanInput input) {
  const absl::StatusOr<OwnershipPlan> flat = PlanOwnership(input);
  ASSERT_TRUE(flat.ok()) << flat.status();
  input.nodes = Blocks(16, 8);
  const absl::StatusOr<OwnershipPlan> spread = PlanOwnership(input);
  ASSERT_TRUE(spread.ok()) << spread.status();
  ExpectValidPlan(input, *spread);
  ExpectSameWorkersRelabelled(*flat, *spread);
  const std::map<int32_t, int64_t> bytes = LinkBytesByNode(input, *spread);
  ASSERT_EQ(bytes.size(), 2u);
  EXPECT_EQ(bytes.at(0), bytes.at(1));
}

// Workers report the memory their device had free, which differs by what
// else each device holds (a trainer, its peers' workers): they are dealt
// over the nodes all the same.
TEST(PlannerNodesTest, WorkersOfDifferentFreeMemoryAreDealtOverTheNodes) {
  PlanInput input = EqualMatrices(4, 16);
  for (int w = 0; w < 16; ++w) {
    input.workers[w].memory_bytes -= int64_t{w} * 3 << 20;
  }
  ExpectDealtEvenlyOverTwoNodes(input);
}

// Each worker's cost table is parsed from its own join: equal tables make
// one class (one memoized cost curve), and the workers are dealt over the
// nodes as without tables.
TEST(PlannerNodesTest, WorkersWithEqualCostTablesAreDealtOverTheNodes) {
  PlanInput input = EqualMatrices(4, 16);
  for (WorkerSpec& w : input.workers) {
    absl::StatusOr<CostTable> table = CostTable::Parse(
        R"({"rows": 4096, "cols": 4096, "algorithm": "gram", "batch": 1, )"
        R"("seconds": 0.004})");
    ASSERT_TRUE(table.ok()) << table.status();
    w.costs = std::make_shared<const CostTable>(*std::move(table));
  }
  ExpectDealtEvenlyOverTwoNodes(input);
}

// A worker's items go only to an index with room for them: where the
// other node's workers cannot hold a matrix, the owners stay where the
// placement put them.
TEST(PlannerNodesTest, OwnersMoveOnlyWhereTheyFit) {
  PlanInput input = EqualMatrices(2, 4);
  input.options.workspace_bytes = 0;
  const int64_t one = OwnedBytes(input.matrices[0]);
  input.workers[0].memory_bytes = 2 * one;
  input.workers[1].memory_bytes = 2 * one;
  input.workers[2].memory_bytes = one - 1;
  input.workers[3].memory_bytes = one - 1;
  const absl::StatusOr<OwnershipPlan> flat = PlanOwnership(input);
  ASSERT_TRUE(flat.ok()) << flat.status();
  input.nodes = Blocks(4, 2);
  const absl::StatusOr<OwnershipPlan> spread = PlanOwnership(input);
  ASSERT_TRUE(spread.ok()) << spread.status();
  ExpectValidPlan(input, *spread);
  for (const ItemOwners& o : spread->owners) {
    EXPECT_LT(o[0], 2) << "on node 1, which has no room for it";
  }
}

// Node numbers need not be dense or in rank order.
TEST(PlannerNodesTest, NodesAreNumbersOfAnyOrder) {
  PlanInput input = EqualMatrices(3, 6);
  input.nodes = {7, 3, 7, 3, 42, 42};
  const absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
  const std::map<int32_t, int64_t> bytes = LinkBytesByNode(input, *plan);
  ASSERT_EQ(bytes.size(), 3u);
  EXPECT_EQ(bytes.at(3), bytes.at(7));
  EXPECT_EQ(bytes.at(3), bytes.at(42));
}

TEST(PlannerNodesTest, OneNodeLeavesThePlanAsItWas) {
  PlanInput input = EqualMatrices(5, 8);
  const absl::StatusOr<OwnershipPlan> flat = PlanOwnership(input);
  input.nodes.assign(8, 3);
  const absl::StatusOr<OwnershipPlan> one = PlanOwnership(input);
  ASSERT_TRUE(flat.ok() && one.ok());
  EXPECT_EQ(flat->owners, one->owners);
  EXPECT_EQ(flat->worker_seconds, one->worker_seconds);
}

// A slower worker's load only ever moves to another of its speed.
TEST(PlannerNodesTest, OnlyInterchangeableWorkersTradePlaces) {
  PlanInput input = EqualMatrices(6, 8);
  for (int w = 0; w < 4; ++w) input.workers[w].speed = 0.5;
  const absl::StatusOr<OwnershipPlan> flat = PlanOwnership(input);
  input.nodes = {0, 0, 1, 1, 0, 0, 1, 1};
  const absl::StatusOr<OwnershipPlan> spread = PlanOwnership(input);
  ASSERT_TRUE(flat.ok() && spread.ok());
  ExpectValidPlan(input, *spread);
  ExpectSameWorkersRelabelled(*flat, *spread);
  for (const auto& half : {std::make_pair(0, 4), std::make_pair(4, 8)}) {
    std::vector<double> a(flat->worker_seconds.begin() + half.first,
                          flat->worker_seconds.begin() + half.second);
    std::vector<double> b(spread->worker_seconds.begin() + half.first,
                          spread->worker_seconds.begin() + half.second);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_NEAR(a[k], b[k], kRel * (a[k] + 1e-12))
          << "speed class " << half.first;
    }
  }
}

// Whole experts held by the trainers stay where they are held.
TEST(PlannerNodesTest, WholeExpertsAtTheirHoldersStayThere) {
  PlanInput input = EqualMatrices(0, 4);
  MatrixSpec experts;
  experts.name = "experts";
  experts.rows = 1024;
  experts.cols = 1024;
  experts.experts = 4;
  experts.layout = Layout::kRowSharded;
  experts.shard_experts = true;
  input.matrices.push_back(experts);
  input.trainer_shards.shards = 4;
  input.trainer_shards.shard_of = {0, 1, 2, 3};
  const absl::StatusOr<OwnershipPlan> flat = PlanOwnership(input);
  input.nodes = {0, 0, 1, 1};
  const absl::StatusOr<OwnershipPlan> spread = PlanOwnership(input);
  ASSERT_TRUE(flat.ok() && spread.ok());
  EXPECT_EQ(flat->owners, spread->owners);
}

TEST(PlannerNodesTest, NodesOfTheWrongCountOrSignAreInvalid) {
  PlanInput input = EqualMatrices(2, 4);
  input.nodes = {0, 0, 1};
  absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("nodes"), std::string::npos)
      << plan.status();
  input.nodes = {0, 0, -1, 1};
  plan = PlanOwnership(input);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("nodes of worker \"w2\""),
            std::string::npos)
      << plan.status();
}

// Random instances on random nodes: valid plans, with the same loads as
// without the nodes.
TEST(PlannerNodesTest, RandomInstancesOnNodesAreTheSameLoadsRelabelled) {
  for (uint32_t seed = 1; seed <= 100; ++seed) {
    PlanInput input = RandomInput(seed, {});
    input.trainer_shards = {};
    const absl::StatusOr<OwnershipPlan> flat = PlanOwnership(input);
    std::mt19937 rng(seed);
    const int nodes = 1 + static_cast<int>(rng() % 4);
    for (size_t w = 0; w < input.workers.size(); ++w) {
      input.nodes.push_back(static_cast<int32_t>(rng() % nodes));
    }
    const absl::StatusOr<OwnershipPlan> spread = PlanOwnership(input);
    ASSERT_EQ(flat.ok(), spread.ok()) << "seed " << seed;
    if (!flat.ok()) continue;
    ExpectValidPlan(input, *spread);
    ExpectSameWorkersRelabelled(*flat, *spread);
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
