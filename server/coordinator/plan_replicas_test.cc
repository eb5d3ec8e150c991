// Plans of jobs with HSDP's replica groups (JobSpec.replicas): CreateJob
// checks the replicas against the trainers and the layouts, and GetJob
// answers them; the plan has no owner groups until every rank's heartbeat
// names its trainer's rank, then one per replica group, its ranks by
// trainer rank, required (not weighed) and re-planned when a rank's
// trainer rank changes; a drain keeps them; they survive a restart of a
// coordinator on --state_dir.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_fixture.h"
#include "server/coordinator/job_store.h"
#include "server/coordinator/plan_computation.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::Beat;
using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::CredentialedState;
using coordinator_test::kGiB;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> Members(const v1::OwnerGroup& group) {
  return {group.workers().begin(), group.workers().end()};
}

TEST(ReplicaGroupsTest, GroupsRanksByTrainerRankOnceAllAreKnown) {
  std::string why;
  // Ranks 0..3 hold trainers 3, 0, 2, 1: groups of trainers {0, 1} and
  // {2, 3}, each by trainer rank.
  EXPECT_THAT(ReplicaGroups(2, 4, {3, 0, 2, 1}, &why),
              ElementsAre(ElementsAre(1, 3), ElementsAre(2, 0)));
  EXPECT_THAT(ReplicaGroups(4, 4, {3, 0, 2, 1}, &why),
              ElementsAre(ElementsAre(1), ElementsAre(3), ElementsAre(2),
                          ElementsAre(0)));
  EXPECT_THAT(ReplicaGroups(1, 4, {3, 0, 2, 1}, &why), IsEmpty());

  EXPECT_THAT(ReplicaGroups(2, 4, {3, std::nullopt, 2, std::nullopt}, &why),
              IsEmpty());
  EXPECT_THAT(why, HasSubstr("ranks 1, 3 are not known yet"));
  EXPECT_THAT(ReplicaGroups(2, 4, {3, 0, 3, 1}, &why), IsEmpty());
  EXPECT_THAT(why, HasSubstr("ranks 0 and 2 both name trainer rank 3"));
  EXPECT_THAT(ReplicaGroups(2, 4, {3, 0, 4, 1}, &why), IsEmpty());
  EXPECT_THAT(why, HasSubstr("rank 2's trainer is rank 4"));
  // Fewer ranks than trainers (not all joined yet).
  EXPECT_THAT(ReplicaGroups(2, 4, {0, 1}, &why), IsEmpty());
  EXPECT_THAT(why, HasSubstr("2 ranks of 4 trainers"));
}

// 8 row-sharded 1024 x 1024 matrices, 2 replica groups of 4 trainers.
v1::JobSpec ReplicasSpec() {
  v1::JobSpec spec = Spec("x", 8);
  for (v1::Matrix& m : *spec.mutable_matrices()) {
    m.set_layout(v1::LAYOUT_ROW_SHARDED);
  }
  spec.set_trainers(4);
  spec.set_replicas(2);
  return spec;
}

class PlanReplicasTest : public CoordinatorTest {
 protected:
  void BeatOk(const std::string& worker, std::optional<int> trainer_rank,
              const std::string& token = "") {
    BeatWithTrainer("x", worker, trainer_rank, token);
  }
  v1::Plan Monitored() { return CoordinatorTest::Monitored("x"); }
  void JoinFour() {
    for (int w = 0; w < 4; ++w) JoinOk("x", absl::StrCat("w", w), 16 * kGiB);
  }
};

TEST_F(PlanReplicasTest, CreateJobChecksTheReplicasAndGetJobAnswersThem) {
  v1::JobSpec uneven = ReplicasSpec();
  uneven.set_replicas(3);
  EXPECT_THAT(state_->CreateJob(Create(uneven)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "job.replicas"));
  v1::JobSpec unreduced = ReplicasSpec();
  unreduced.mutable_matrices(5)->set_layout(v1::LAYOUT_UNREDUCED);
  EXPECT_THAT(state_->CreateJob(Create(unreduced)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "layers.5.w"));
  ASSERT_TRUE(state_->CreateJob(Create(ReplicasSpec())).ok());
  const absl::StatusOr<v1::Job> job = state_->GetJob("x");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().replicas(), 2);
}

TEST_F(PlanReplicasTest, HeartbeatsTrainerRankMustNotBeNegative) {
  ASSERT_TRUE(state_->CreateJob(Create(ReplicasSpec())).ok());
  JoinFour();
  v1::HeartbeatRequest r = Beat("x", "w0", CurrentPlan("x").version());
  r.set_has_trainer(true);
  r.set_trainer_rank(-1);
  EXPECT_THAT(state_->Heartbeat(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "trainer_rank"));
}

TEST_F(PlanReplicasTest, GroupsByTrainerRankOnceEveryRankNamesOne) {
  ASSERT_TRUE(state_->CreateJob(Create(ReplicasSpec())).ok());
  JoinFour();
  const v1::Plan joined = CurrentPlan("x");
  EXPECT_EQ(joined.workers_size(), 4);
  EXPECT_EQ(joined.owner_groups_size(), 0);  // no trainer ranks yet

  // Some known: the plan stands.
  BeatOk("w0", 3);
  BeatOk("w1", 0);
  BeatOk("w2", std::nullopt);  // no trainer yet
  const v1::Plan some = Monitored();
  EXPECT_EQ(some.version(), joined.version());
  EXPECT_EQ(some.owner_groups_size(), 0);

  BeatOk("w2", 2);
  BeatOk("w3", 1);
  const v1::Plan grouped = Monitored();
  EXPECT_GT(grouped.version(), joined.version());
  EXPECT_THAT(grouped.reason(), HasSubstr("trainer is rank"));
  ASSERT_EQ(grouped.owner_groups_size(), 2);
  EXPECT_THAT(Members(grouped.owner_groups(0)), ElementsAre("w1", "w3"));
  EXPECT_THAT(Members(grouped.owner_groups(1)), ElementsAre("w2", "w0"));
  // Owners in the first group; every worker holds its position's momentum.
  for (const v1::MatrixPlacement& m : grouped.matrices()) {
    ASSERT_EQ(m.owners_size(), 1) << m.name();
    EXPECT_THAT(m.owners(0), ::testing::AnyOf("w1", "w3")) << m.name();
  }
  ASSERT_EQ(grouped.loads_size(), 4);
  for (const v1::WorkerLoad& load : grouped.loads()) {
    EXPECT_GT(load.momentum_bytes(), 0) << load.worker_id();
  }

  // The same ranks again (a trainer that attached again): the plan stands.
  BeatOk("w3", std::nullopt);
  BeatOk("w3", 1);
  EXPECT_EQ(Monitored().version(), grouped.version());

  // Restarted trainers whose ranks moved: while two name one rank the plan
  // stands, then the new groups.
  BeatOk("w0", 0);
  EXPECT_EQ(Monitored().version(), grouped.version());
  BeatOk("w1", 3);
  const v1::Plan moved = Monitored();
  EXPECT_GT(moved.version(), grouped.version());
  ASSERT_EQ(moved.owner_groups_size(), 2);
  EXPECT_THAT(Members(moved.owner_groups(0)), ElementsAre("w0", "w3"));
  EXPECT_THAT(Members(moved.owner_groups(1)), ElementsAre("w2", "w1"));
}

TEST_F(PlanReplicasTest, ADrainKeepsTheGroupsItsPositionOwningNothing) {
  ASSERT_TRUE(state_->CreateJob(Create(ReplicasSpec())).ok());
  JoinFour();
  for (const auto& [worker, rank] : std::vector<std::pair<std::string, int>>{
           {"w0", 3}, {"w1", 0}, {"w2", 2}, {"w3", 1}}) {
    BeatOk(worker, rank);
  }
  ASSERT_EQ(Monitored().owner_groups_size(), 2);
  v1::DrainWorkerRequest drain;
  drain.set_job("x");
  drain.set_worker_id("w0");  // trainer 3: the second position of group 1
  ASSERT_TRUE(state_->DrainWorker(drain).ok());
  const v1::Plan drained = CurrentPlan("x");
  ASSERT_EQ(drained.owner_groups_size(), 2);
  EXPECT_THAT(Members(drained.owner_groups(0)), ElementsAre("w1", "w3"));
  EXPECT_THAT(Members(drained.owner_groups(1)), ElementsAre("w2", "w0"));
  for (const v1::MatrixPlacement& m : drained.matrices()) {
    EXPECT_EQ(m.owners(0), "w1") << m.name();
  }
  for (const v1::WorkerLoad& load : drained.loads()) {
    const bool second = load.worker_id() == "w0" || load.worker_id() == "w3";
    EXPECT_EQ(load.momentum_bytes() == 0, second) << load.worker_id();
  }
}

// A job of replica groups is not grouped by nodes: two nodes of two
// workers whose replicated matrices would win groups per node (on a slow
// network) wait for the trainer ranks, then take the replica groups.
TEST_F(PlanReplicasTest, NoGroupsOfNodes) {
  CoordinatorOptions options = Options();
  options.links.inter_node_gbs = 1;
  Reset(options);
  v1::JobSpec spec = ReplicasSpec();
  for (v1::Matrix& m : *spec.mutable_matrices()) {
    m.set_layout(v1::LAYOUT_REPLICATED);
  }
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  for (int w = 0; w < 4; ++w) {
    v1::JoinJobRequest join =
        coordinator_test::Join("x", absl::StrCat("w", w), 16 * kGiB);
    join.mutable_device()->set_node(w < 2 ? "a" : "b");
    ASSERT_TRUE(state_->JoinJob(join).ok()) << w;
  }
  EXPECT_EQ(CurrentPlan("x").owner_groups_size(), 0);
  for (int w = 0; w < 4; ++w) BeatOk(absl::StrCat("w", w), 3 - w);
  const v1::Plan plan = Monitored();
  ASSERT_EQ(plan.owner_groups_size(), 2);
  EXPECT_THAT(Members(plan.owner_groups(0)), ElementsAre("w3", "w2"));
  EXPECT_THAT(Members(plan.owner_groups(1)), ElementsAre("w1", "w0"));
}

// A coordinator on --state_dir (JobStore), restarted.
class PlanReplicasRestartTest : public PlanReplicasTest {
 protected:
  PlanReplicasRestartTest() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/replicas_XXXXXX");
    EXPECT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  ~PlanReplicasRestartTest() override {
    state_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  void Restart() {
    state_.reset();
    absl::StatusOr<std::unique_ptr<JobStore>> store =
        JobStore::Open(root_ + "/state");
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<std::unique_ptr<Coordinator>> opened = Coordinator::Open(
        Options(), *std::move(store), [this] { return clock_.Now(); });
    ASSERT_TRUE(opened.ok()) << opened.status();
    state_ = std::make_unique<CredentialedState>(*std::move(opened));
  }

  std::string root_;
};

TEST_F(PlanReplicasRestartTest, TheGroupsSurviveARestart) {
  ASSERT_NO_FATAL_FAILURE(Restart());
  ASSERT_TRUE(state_->CreateJob(Create(ReplicasSpec())).ok());
  JoinFour();
  const std::vector<std::pair<std::string, int>> ranks = {
      {"w0", 3}, {"w1", 0}, {"w2", 2}, {"w3", 1}};
  std::vector<std::string> tokens;
  for (const auto& [worker, rank] : ranks) {
    tokens.push_back(state_->worker_token("x", worker));
    BeatOk(worker, rank);
  }
  const v1::Plan before = Monitored();
  ASSERT_EQ(before.owner_groups_size(), 2);

  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(CurrentPlan("x").SerializeAsString(), before.SerializeAsString());
  // The heartbeats name the trainer ranks again, one by one: the stored
  // plan stands throughout (its groups are theirs).
  for (size_t w = 0; w < ranks.size(); ++w) {
    BeatOk(ranks[w].first, ranks[w].second, tokens[w]);
    EXPECT_EQ(Monitored().version(), before.version()) << w;
  }
  EXPECT_EQ(CurrentPlan("x").SerializeAsString(), before.SerializeAsString());
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
