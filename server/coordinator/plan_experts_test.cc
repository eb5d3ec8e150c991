// Plans of jobs whose trainers hold whole experts (a row_sharded stack with
// shard_experts, as FSDP2 shards a 3-D parameter): once heartbeats name
// the trainers' ranks, each expert is owned by the worker whose trainer
// holds it, so its gradient and update never move; a trainer attaching
// again with its rank keeps the plan; ranks that move re-plan and the
// experts follow them. The rule of who holds what is common/row_ranges.h.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_fixture.h"
#include "server/coordinator/plan_computation.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::kGiB;
using coordinator_test::Spec;
using ::testing::HasSubstr;

constexpr int kExperts = 8;
constexpr int kTrainers = 4;

// 4 stacks of 8 experts of 256 x 512, held as whole experts by 4 trainers.
v1::JobSpec ExpertsSpec() {
  v1::JobSpec spec = Spec("x", 4, 256, 512);
  for (v1::Matrix& m : *spec.mutable_matrices()) {
    m.set_layout(v1::LAYOUT_ROW_SHARDED);
    m.set_experts(kExperts);
    m.set_shard_experts(true);
  }
  spec.set_trainers(kTrainers);
  return spec;
}

class PlanExpertsTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(state_->CreateJob(Create(ExpertsSpec())).ok());
    for (int w = 0; w < kTrainers; ++w) {
      JoinOk("x", absl::StrCat("w", w), 16 * kGiB);
    }
  }
  void Ranks(const std::map<std::string, int>& trainer_rank) {
    for (const auto& [worker, rank] : trainer_rank) {
      BeatWithTrainer("x", worker, rank);
    }
  }
  // Every expert's owner is the worker of the trainer holding it.
  static void ExpectExpertsWithHolders(
      const v1::Plan& plan, const std::map<std::string, int>& trainer_rank) {
    std::map<int, std::string> worker_of;
    for (const auto& [worker, rank] : trainer_rank) worker_of[rank] = worker;
    ASSERT_EQ(plan.matrices_size(), 4);
    for (const v1::MatrixPlacement& m : plan.matrices()) {
      ASSERT_EQ(m.owners_size(), kExperts) << m.name();
      for (int e = 0; e < kExperts; ++e) {
        EXPECT_EQ(m.owners(e),
                  worker_of[ShardHoldingExpert(kExperts, e, kTrainers)])
            << m.name() << " expert " << e;
      }
    }
  }
};

TEST_F(PlanExpertsTest, ExpertsAreOwnedWhereTheirTrainersHoldThem) {
  const v1::Plan joined = CurrentPlan("x");
  const std::map<std::string, int> ranks = {
      {"w0", 2}, {"w1", 0}, {"w2", 3}, {"w3", 1}};
  Ranks(ranks);
  const v1::Plan placed = Monitored("x");
  EXPECT_GT(placed.version(), joined.version());
  EXPECT_THAT(placed.reason(), HasSubstr("trainer is rank"));
  ExpectExpertsWithHolders(placed, ranks);

  // A trainer attaching again under its rank: the plan stands, also while
  // its rank is not known.
  BeatWithTrainer("x", "w3", std::nullopt);
  EXPECT_EQ(Monitored("x").version(), placed.version());
  BeatWithTrainer("x", "w3", 1);
  EXPECT_EQ(Monitored("x").version(), placed.version());

  // Restarted trainers whose ranks moved: the experts follow them.
  const std::map<std::string, int> moved = {
      {"w0", 0}, {"w1", 2}, {"w2", 3}, {"w3", 1}};
  Ranks(moved);
  const v1::Plan after = Monitored("x");
  EXPECT_GT(after.version(), placed.version());
  ExpectExpertsWithHolders(after, moved);
}

TEST_F(PlanExpertsTest, AStartingJobPlansItsExpertsOnceEveryRankIsKnown) {
  const v1::Plan joined = CurrentPlan("x");
  BeatWithTrainer("x", "w2", 0);
  BeatWithTrainer("x", "w0", 1);
  BeatWithTrainer("x", "w1", 2);
  const v1::Plan some = Monitored("x");
  EXPECT_EQ(some.version(), joined.version());
  EXPECT_EQ(some.trainer_shards(), 0);
  BeatWithTrainer("x", "w3", 3);
  const v1::Plan all = Monitored("x");
  EXPECT_GT(all.version(), joined.version());
  EXPECT_EQ(all.trainer_shards(), kTrainers);
  ExpectExpertsWithHolders(all, {{"w2", 0}, {"w0", 1}, {"w1", 2}, {"w3", 3}});
}

TEST(WholeExpertShardsTest, ShardsByTrainerRankForJobsOfWholeExperts) {
  std::vector<scheduler::MatrixSpec> rows(1);
  rows[0].layout = scheduler::Layout::kRowSharded;
  rows[0].experts = 4;
  EXPECT_FALSE(WholeExpertShards(rows, 4, 0, {0, 1, 2, 3}).known());
  std::vector<scheduler::MatrixSpec> whole = rows;
  whole[0].shard_experts = true;
  scheduler::TrainerShards t =
      WholeExpertShards(whole, 4, 0, {3, std::nullopt, 1, 7});
  EXPECT_EQ(t.shards, 4);
  EXPECT_EQ(t.shard_of, (std::vector<int32_t>{3, -1, 1, -1}));
  // HSDP: 2 replica groups of 2 shards.
  t = WholeExpertShards(whole, 4, 2, {3, 0, 2, 1});
  EXPECT_EQ(t.shards, 2);
  EXPECT_EQ(t.shard_of, (std::vector<int32_t>{1, 0, 0, 1}));
  EXPECT_FALSE(WholeExpertShards(whole, 4, 0, {std::nullopt}).known());
  EXPECT_FALSE(WholeExpertShards(whole, 1, 0, {0}).known());
  EXPECT_FALSE(WholeExpertShards(whole, 0, 0, {0}).known());
  EXPECT_FALSE(CoversEveryTrainer(
      WholeExpertShards(whole, 4, 0, {3, std::nullopt, 1, 2}), 0));
  EXPECT_TRUE(CoversEveryTrainer(
      WholeExpertShards(whole, 3, 0, {2, 0, 1, std::nullopt}), 1));
  // A rank not known now keeps the shard the previous plan gave its worker.
  t = KeepKnownShards(WholeExpertShards(whole, 2, 0, {std::nullopt, 0}),
                      {"a", "b"}, {.shards = 2, .shard_of = {0, 1}},
                      {"b", "a"});
  EXPECT_EQ(t.shard_of, (std::vector<int32_t>{1, 0}));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
