// Tests of where the planner leaves whole experts (planner.h,
// PlanInput::trainer_shards): each expert of a stack sharded on its
// experts stays with the worker whose trainer holds it wherever that costs
// nothing, so its gradient and update never move; the plan's loads are
// those of the plan made without knowing the holders.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "gtest/gtest.h"
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

MatrixSpec Stack(const std::string& name, int64_t rows, int64_t cols,
                 int64_t experts, int32_t layer) {
  MatrixSpec m;
  m.name = name;
  m.rows = rows;
  m.cols = cols;
  m.experts = experts;
  m.dtype = DType::kBFloat16;
  m.layout = Layout::kRowSharded;
  m.shard_experts = true;
  m.layer = layer;
  return m;
}

// A MoE-like set: per layer, gate/up/down stacks of `experts` experts and
// an attention matrix held row-split.
PlanInput MoeInput(int workers, int64_t experts) {
  PlanInput input;
  for (int layer = 0; layer < 4; ++layer) {
    input.matrices.push_back(
        Stack(absl::StrCat("l", layer, ".gate"), 96, 256, experts, layer));
    input.matrices.push_back(
        Stack(absl::StrCat("l", layer, ".up"), 96, 256, experts, layer));
    input.matrices.push_back(
        Stack(absl::StrCat("l", layer, ".down"), 256, 96, experts, layer));
    MatrixSpec attention = Stack(absl::StrCat("l", layer, ".qkv"), 384, 256,
                                 /*experts=*/1, layer);
    attention.shard_experts = false;
    input.matrices.push_back(attention);
  }
  for (int w = 0; w < workers; ++w) {
    input.workers.push_back(Worker(absl::StrCat("w", w), 8 * kGiB));
  }
  return input;
}

// Trainer ranks as the workers' order (or as `shard_of`).
TrainerShards Shards(int workers, std::vector<int32_t> shard_of = {}) {
  TrainerShards t;
  t.shards = workers;
  if (shard_of.empty()) {
    for (int w = 0; w < workers; ++w) shard_of.push_back(w);
  }
  t.shard_of = std::move(shard_of);
  return t;
}

// Experts of stacks sharded on their experts, and of them those owned by
// the worker whose trainer holds them.
struct Home {
  int experts = 0;
  int at_home = 0;
};

Home CountHome(const PlanInput& input, const TrainerShards& t,
               const OwnershipPlan& plan) {
  std::vector<int32_t> all;
  for (size_t w = 0; w < input.workers.size(); ++w) all.push_back(w);
  const std::vector<int32_t> holder = t.HoldersAmong(all);
  Home home;
  for (size_t m = 0; m < input.matrices.size(); ++m) {
    const MatrixSpec& spec = input.matrices[m];
    if (!spec.shard_experts) continue;
    for (int64_t e = 0; e < spec.experts; ++e) {
      ++home.experts;
      const int32_t s = t.ShardOfExpert(spec, e);
      if (s >= 0 && holder[s] == plan.owners[m][e]) ++home.at_home;
    }
  }
  return home;
}

void ExpectSameLoads(const OwnershipPlan& a, const OwnershipPlan& b) {
  ASSERT_EQ(a.worker_seconds.size(), b.worker_seconds.size());
  for (size_t w = 0; w < a.worker_seconds.size(); ++w) {
    EXPECT_NEAR(a.worker_seconds[w], b.worker_seconds[w],
                kRel * b.worker_seconds[w])
        << "worker " << w;
  }
  EXPECT_EQ(a.worker_memory_bytes, b.worker_memory_bytes);
  EXPECT_NEAR(a.max_seconds, b.max_seconds, kRel * b.max_seconds);
}

TEST(PlannerExpertsTest, EveryExpertStaysWithItsHolderWhereTheLoadsAllowIt) {
  for (const int workers : {2, 4, 8}) {
    PlanInput input = MoeInput(workers, /*experts=*/16);
    auto blind = PlanOwnership(input);
    ASSERT_TRUE(blind.ok()) << blind.status();
    input.trainer_shards = Shards(workers);
    auto placed = PlanOwnership(input);
    ASSERT_TRUE(placed.ok()) << placed.status();
    ExpectValidPlan(input, *placed);
    ExpectSameLoads(*placed, *blind);
    // Every expert is of one kind (96 x 256 up to orientation, bf16), and
    // each trainer holds 16 / workers of each of the 12 stacks: a worker
    // keeps as many of its own as it owns experts.
    const int held = 12 * 16 / workers;
    int most = 0;
    for (int w = 0; w < workers; ++w) {
      int owned = 0;
      for (const Batch& b : placed->batches) {
        if (b.worker == w && b.rows == 96) owned += b.items.size();
      }
      most += std::min(held, owned);
    }
    const Home home = CountHome(input, input.trainer_shards, *placed);
    EXPECT_EQ(home.experts, 12 * 16);
    EXPECT_EQ(home.at_home, most) << workers << " workers";
    EXPECT_LT(CountHome(input, input.trainer_shards, *blind).at_home,
              home.at_home);
    // 2 and 4 workers share every kind: all stay.
    if (workers <= 4) {
      EXPECT_EQ(home.at_home, home.experts);
    }
  }
}

TEST(PlannerExpertsTest, ExpertsFollowTheTrainerRanksNotTheWorkerOrder) {
  PlanInput input = MoeInput(4, 8);
  input.trainer_shards = Shards(4, {2, 0, 3, 1});
  auto plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
  const Home home = CountHome(input, input.trainer_shards, *plan);
  EXPECT_EQ(home.at_home, home.experts);
  // Expert 0 of every stack is shard 0's, which worker 1's trainer holds.
  for (size_t m = 0; m < input.matrices.size(); ++m) {
    if (input.matrices[m].shard_experts) {
      EXPECT_EQ(plan->owners[m][0], 1);
    }
  }
}

TEST(PlannerExpertsTest, FewerExpertsThanTrainersStayWhereTheLoadsAllow) {
  // 3 experts over 4 trainers: shard 3 holds none (torch.chunk), and
  // worker 3 still gets work.
  PlanInput input = MoeInput(4, 3);
  input.trainer_shards = Shards(4);
  auto plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
  input.trainer_shards = {};
  auto blind = PlanOwnership(input);
  ASSERT_TRUE(blind.ok());
  ExpectSameLoads(*plan, *blind);
  EXPECT_GT(CountHome(input, Shards(4), *plan).at_home,
            CountHome(input, Shards(4), *blind).at_home);
}

TEST(PlannerExpertsTest, UnknownRanksAndDrainingHoldersPlaceNothing) {
  PlanInput input = MoeInput(4, 8);
  auto blind = PlanOwnership(input);
  ASSERT_TRUE(blind.ok());
  // Shard of no worker known: as without.
  input.trainer_shards = Shards(4, {-1, -1, -1, -1});
  auto none = PlanOwnership(input);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->owners, blind->owners);
  // A holder that must own nothing keeps nothing.
  input.trainer_shards = Shards(4);
  input.workers[2].owns_nothing = true;
  auto drained = PlanOwnership(input);
  ASSERT_TRUE(drained.ok()) << drained.status();
  ExpectValidPlan(input, *drained);
  EXPECT_EQ(plan_test::CountOn(*drained, 2), 0);
}

TEST(PlannerExpertsTest, ReplanMovesExpertsToNewHoldersOnly) {
  for (const bool at_holders : {false, true}) {
    PlanInput input = MoeInput(4, 8);
    input.trainer_shards = Shards(4);
    input.options.experts_at_holders = at_holders;
    auto first = PlanOwnership(input);
    ASSERT_TRUE(first.ok());
    // The same ranks again: nothing moves.
    auto same = Replan(input, *first);
    ASSERT_TRUE(same.ok()) << same.status();
    EXPECT_EQ(same->owners, first->owners);
    EXPECT_EQ(same->moved_bytes, 0);
    // Trainers swap workers (restarted in another order): their experts
    // follow them.
    input.trainer_shards = Shards(4, {3, 0, 2, 1});
    auto moved = Replan(input, *first);
    ASSERT_TRUE(moved.ok()) << moved.status();
    ExpectValidPlan(input, *moved);
    const Home home = CountHome(input, input.trainer_shards, *moved);
    EXPECT_EQ(home.at_home, home.experts) << at_holders;
    EXPECT_GT(moved->moved_bytes, 0);
    // Swapped home where that costs nothing: the plan costs what it did.
    if (!at_holders) ExpectSameLoads(*moved, *first);
  }
}

TEST(PlannerExpertsTest, RandomInstancesKeepTheirLoads) {
  std::mt19937 rng(7);
  for (int seed = 0; seed < plan_test::kRandomInstances; ++seed) {
    PlanInput input = RandomInput(seed, {});
    for (MatrixSpec& m : input.matrices) {
      m.shard_experts = m.layout == Layout::kRowSharded && m.experts > 1 &&
                        plan_test::Chance(rng, 0.7);
    }
    auto blind = PlanOwnership(input);
    if (!blind.ok()) continue;  // a random instance that does not fit
    const int workers = static_cast<int>(input.workers.size());
    std::vector<int32_t> shard_of(workers);
    for (int w = 0; w < workers; ++w) shard_of[w] = w;
    std::shuffle(shard_of.begin(), shard_of.end(), rng);
    input.trainer_shards = Shards(workers, shard_of);
    auto placed = PlanOwnership(input);
    ASSERT_TRUE(placed.ok()) << "seed " << seed << ": " << placed.status();
    ExpectValidPlan(input, *placed);
    ExpectSameLoads(*placed, *blind);
    EXPECT_GE(CountHome(input, input.trainer_shards, *placed).at_home,
              CountHome(input, input.trainer_shards, *blind).at_home)
        << "seed " << seed;
  }
}

TEST(PlannerExpertsTest, ExpertsAtHoldersOwnsEveryExpertWhereItIsHeld) {
  for (const int workers : {2, 3, 8}) {
    PlanInput input = MoeInput(workers, /*experts=*/16);
    input.trainer_shards = Shards(workers);
    input.options.experts_at_holders = true;
    auto plan = PlanOwnership(input);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ExpectValidPlan(input, *plan);
    const Home home = CountHome(input, input.trainer_shards, *plan);
    EXPECT_EQ(home.at_home, home.experts) << workers << " workers";
    // Without the trainers' shards the option changes nothing.
    PlanInput blind = input;
    blind.trainer_shards = {};
    auto free = PlanOwnership(blind);
    blind.options.experts_at_holders = false;
    auto plain = PlanOwnership(blind);
    ASSERT_TRUE(free.ok() && plain.ok());
    EXPECT_EQ(free->owners, plain->owners);
  }
}

TEST(PlannerExpertsTest, ExpertsAtHoldersWithoutTheMemoryGoElsewhere) {
  PlanInput input = MoeInput(4, 8);
  input.trainer_shards = Shards(4);
  input.options.experts_at_holders = true;
  input.options.workspace_bytes = 0;
  // Worker 0 has room for only some of the experts its trainer holds.
  input.workers[0].memory_bytes = 3 * OwnedBytes(input.matrices[0]);
  auto plan = PlanOwnership(input);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectValidPlan(input, *plan);
  EXPECT_LE(plan_test::CountOn(*plan, 0), 3);
  const Home home = CountHome(input, input.trainer_shards, *plan);
  EXPECT_LT(home.at_home, home.experts);
  EXPECT_GE(home.at_home, home.experts - 2 * 12 + 3);
}

TEST(PlannerExpertsTest, TrainerShardsOfTheWrongSizeAreRefusedByName) {
  PlanInput input = MoeInput(4, 8);
  input.trainer_shards = Shards(4, {0, 1, 2});
  auto plan = PlanOwnership(input);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("trainer_shards"), std::string::npos)
      << plan.status();
  input.trainer_shards = Shards(4, {0, 1, 2, 4});
  plan = PlanOwnership(input);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("\"w3\""), std::string::npos)
      << plan.status();
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
