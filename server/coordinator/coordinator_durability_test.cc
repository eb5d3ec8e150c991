// A Coordinator over a JobStore (muonps-coordinator --state_dir): a
// coordinator opened again on the same directory has every job, member,
// credential, plan and NCCL id it acknowledged, gives members a fresh
// lease, never hands out a plan version it handed out before (also for a
// job deleted and created again), keeps a plan's owner groups, and
// re-plans a job whose stored plan is not of its stored members.
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/fake_clock.h"
#include "server/coordinator/job_store.h"
#include "server/coordinator/record_wire.h"
#include "server/coordinator/served_coordinator.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::ServedCoordinator;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kTtl = absl::Seconds(10);

v1::CreateJobRequest Create(const std::string& name,
                            const std::string& request_id = "r1") {
  v1::CreateJobRequest r;
  r.set_request_id(request_id);
  r.mutable_job()->set_name(name);
  for (int i = 0; i < 4; ++i) {
    v1::Matrix* m = r.mutable_job()->add_matrices();
    m->set_name(absl::StrCat("layers.", i, ".w"));
    m->set_rows(256);
    m->set_cols(512);
    m->set_layer(i);
  }
  return r;
}

v1::JoinJobRequest Join(const std::string& job, const std::string& worker) {
  v1::JoinJobRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id("i-" + worker);
  r.mutable_device()->set_kind("cuda");
  r.mutable_device()->set_memory_bytes(int64_t{16} << 30);
  r.set_data_address(worker + ":7001");
  return r;
}

class CoordinatorDurabilityTest : public ::testing::Test {
 protected:
  CoordinatorDurabilityTest() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string pattern =
        absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/durability_XXXXXX");
    EXPECT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
    dir_ = root_ + "/state";
  }
  ~CoordinatorDurabilityTest() override {
    state_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }

  // (Re)starts the coordinator on the directory, as a restarted process
  // would: the old one's store is closed first.
  void Restart() {
    state_.reset();
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    CoordinatorOptions options;
    options.lease_ttl = kTtl;
    options.heartbeat_interval = absl::Seconds(1);
    absl::StatusOr<std::unique_ptr<ServedCoordinator>> state =
        ServedCoordinator::Open(options, *std::move(store),
                                [this] { return clock_.Now(); });
    ASSERT_TRUE(state.ok()) << state.status();
    state_ = *std::move(state);
  }

  v1::JoinJobResponse JoinOk(const std::string& job, const std::string& w) {
    absl::StatusOr<v1::JoinJobResponse> r = state_->JoinJob(Join(job, w));
    EXPECT_TRUE(r.ok()) << w << ": " << r.status();
    return r.ok() ? *r : v1::JoinJobResponse();
  }

  // With `trainer_rank`, the worker's trainer is attached and has that
  // rank; without, no trainer is attached (yet).
  absl::StatusOr<v1::HeartbeatResponse> Beat(
      const std::string& job, const std::string& worker,
      const std::string& token, int64_t version,
      std::optional<int> trainer_rank = std::nullopt) {
    v1::HeartbeatRequest r;
    r.set_job(job);
    r.set_worker_id(worker);
    r.set_instance_id("i-" + worker);
    r.set_worker_token(token);
    r.set_plan_version(version);
    r.set_has_trainer(trainer_rank.has_value());
    if (trainer_rank.has_value()) r.set_trainer_rank(*trainer_rank);
    return state_->Heartbeat(r);
  }

  v1::Plan Current(const std::string& job) {
    v1::GetPlanRequest r;
    r.set_job(job);
    absl::StatusOr<v1::Plan> plan = state_->GetPlan(r);
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : v1::Plan();
  }

  FakeClock clock_;
  std::string root_;
  std::string dir_;
  std::unique_ptr<ServedCoordinator> state_;
};

TEST_F(CoordinatorDurabilityTest,
       RestartKeepsJobsMembersTokensPlanAndNcclIdAndWorkersCarryOn) {
  ASSERT_NO_FATAL_FAILURE(Restart());
  absl::StatusOr<v1::Job> created = state_->CreateJob(Create("x"));
  ASSERT_TRUE(created.ok()) << created.status();
  const v1::JoinJobResponse w1 = JoinOk("x", "w1");
  const v1::JoinJobResponse w2 = JoinOk("x", "w2");
  const v1::Plan before = Current("x");
  ASSERT_EQ(before.version(), 2);
  v1::PutNcclIdRequest put;
  put.set_job("x");
  put.set_plan_version(2);
  put.set_worker_id(before.workers(0));
  put.set_worker_token(before.workers(0) == "w1" ? w1.worker_token()
                                                 : w2.worker_token());
  put.set_nccl_id(std::string(128, 'n'));
  put.set_generation(1);
  ASSERT_TRUE(state_->PutNcclId(put).ok());

  ASSERT_NO_FATAL_FAILURE(Restart());
  absl::StatusOr<v1::Job> job = state_->GetJob("x");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().SerializeAsString(),
            Create("x").job().SerializeAsString());
  EXPECT_THAT(job->workers(), ElementsAre("w1", "w2"));
  EXPECT_EQ(job->plan_version(), 2);
  EXPECT_EQ(Current("x").SerializeAsString(), before.SerializeAsString());
  // The workers' credentials still hold: their heartbeats just go on.
  absl::StatusOr<v1::HeartbeatResponse> beat =
      Beat("x", "w1", w1.worker_token(), 2);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_EQ(beat->plan_version(), 2);
  ASSERT_TRUE(Beat("x", "w2", w2.worker_token(), 2).ok());
  // A join retry from the same process gets the same token and secret.
  const v1::JoinJobResponse again = JoinOk("x", "w2");
  EXPECT_EQ(again.worker_token(), w2.worker_token());
  EXPECT_EQ(again.data_plane_secret(), w2.data_plane_secret());
  EXPECT_EQ(again.plan_version(), 2);
  // The NCCL id of the plan version.
  v1::GetNcclIdRequest get;
  get.set_job("x");
  get.set_plan_version(2);
  get.set_worker_id("w2");
  get.set_worker_token(w2.worker_token());
  absl::StatusOr<v1::GetNcclIdResponse> id = state_->GetNcclId(get);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->nccl_id(), std::string(128, 'n'));
  EXPECT_EQ(id->generation(), 1);
  // A retried CreateJob returns the job token; DeleteJob takes it.
  absl::StatusOr<v1::Job> retried = state_->CreateJob(Create("x"));
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->job_token(), created->job_token());
  v1::DeleteJobRequest del;
  del.set_job("x");
  del.set_job_token(created->job_token());
  EXPECT_TRUE(state_->DeleteJob(del).ok());
  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(state_->GetJob("x").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorDurabilityTest, RestartKeepsThePlansOwnerGroups) {
  ASSERT_NO_FATAL_FAILURE(Restart());
  ASSERT_TRUE(state_->CreateJob(Create("x")).ok());  // replicated matrices
  for (int w = 0; w < 4; ++w) {
    v1::JoinJobRequest join = Join("x", absl::StrCat("w", w));
    join.mutable_device()->set_node(w < 2 ? "node-a" : "node-b");
    // A slow network between the nodes: groups of one node win.
    join.mutable_device()->set_network_gbs(1);
    ASSERT_TRUE(state_->JoinJob(join).ok()) << w;
  }
  const v1::Plan before = Current("x");
  ASSERT_EQ(before.owner_groups_size(), 2);
  EXPECT_THAT(before.owner_groups(1).workers(), ElementsAre("w2", "w3"));

  ASSERT_NO_FATAL_FAILURE(Restart());
  const v1::Plan after = Current("x");
  EXPECT_EQ(after.version(), before.version());
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString());
}

// A job whose trainers hold whole experts: its plan, made once every
// trainer's rank was known, says which shard each worker's trainer holds
// (Plan.trainer_shards). A coordinator opened again has that plan, and the
// same ranks heartbeating again, or not yet, keep it: no expert moves.
TEST_F(CoordinatorDurabilityTest, RestartKeepsTheShardsOfWholeExperts) {
  ASSERT_NO_FATAL_FAILURE(Restart());
  v1::CreateJobRequest create = Create("x");
  for (v1::Matrix& m : *create.mutable_job()->mutable_matrices()) {
    m.set_layout(v1::LAYOUT_ROW_SHARDED);
    m.set_experts(4);
    m.set_shard_experts(true);
  }
  create.mutable_job()->set_trainers(2);
  ASSERT_TRUE(state_->CreateJob(create).ok());
  const std::string tokens[] = {JoinOk("x", "w0").worker_token(),
                                JoinOk("x", "w1").worker_token()};
  // w0's trainer is rank 1, w1's rank 0.
  const auto beat = [&](int w, bool with_rank) {
    const absl::StatusOr<v1::HeartbeatResponse> b =
        Beat("x", absl::StrCat("w", w), tokens[w], Current("x").version(),
             with_rank ? std::optional<int>(1 - w) : std::nullopt);
    EXPECT_TRUE(b.ok()) << w << ": " << b.status();
  };
  beat(0, true);
  beat(1, true);
  state_->ExpireLeases();  // the lease monitor plans what heartbeats changed
  const v1::Plan before = Current("x");
  ASSERT_EQ(before.trainer_shards(), 2);
  for (const v1::WorkerLoad& load : before.loads()) {
    EXPECT_EQ(load.trainer_shard(), load.worker_id() == "w0" ? 1 : 0);
  }

  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(Current("x").SerializeAsString(), before.SerializeAsString());
  beat(0, false);  // its trainer attaching again
  beat(1, true);
  state_->ExpireLeases();
  EXPECT_EQ(Current("x").SerializeAsString(), before.SerializeAsString());
  beat(0, true);
  state_->ExpireLeases();
  EXPECT_EQ(Current("x").SerializeAsString(), before.SerializeAsString());
}

TEST_F(CoordinatorDurabilityTest,
       PlanVersionsNeverGoBackAcrossRestartsOrForAJobCreatedAgain) {
  ASSERT_NO_FATAL_FAILURE(Restart());
  absl::StatusOr<v1::Job> created = state_->CreateJob(Create("x"));
  ASSERT_TRUE(created.ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(JoinOk("x", "w3").plan_version(), 3);
  ASSERT_NO_FATAL_FAILURE(Restart());
  v1::DeleteJobRequest del;
  del.set_job("x");
  del.set_job_token(created->job_token());
  ASSERT_TRUE(state_->DeleteJob(del).ok());
  ASSERT_NO_FATAL_FAILURE(Restart());
  absl::StatusOr<v1::Job> again = state_->CreateJob(Create("x", "r2"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->plan_version(), 3);
  ASSERT_NO_FATAL_FAILURE(Restart());
  EXPECT_EQ(JoinOk("x", "w1").plan_version(), 4);
}

TEST_F(CoordinatorDurabilityTest, RestartGivesEveryMemberAFreshLease) {
  ASSERT_NO_FATAL_FAILURE(Restart());
  ASSERT_TRUE(state_->CreateJob(Create("x")).ok());
  const v1::JoinJobResponse w1 = JoinOk("x", "w1");
  // Down for most of the lease: the restart must not expire it at once.
  clock_.Advance(kTtl - absl::Seconds(1));
  ASSERT_NO_FATAL_FAILURE(Restart());
  clock_.Advance(absl::Seconds(2));
  EXPECT_TRUE(state_->ExpireLeases().empty());
  v1::ListWorkersRequest list;
  list.set_job("x");
  absl::StatusOr<v1::ListWorkersResponse> workers = state_->ListWorkers(list);
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->workers_size(), 1);
  EXPECT_EQ(workers->workers(0).lease_remaining_ms(),
            absl::ToInt64Milliseconds(kTtl - absl::Seconds(2)));
  ASSERT_TRUE(Beat("x", "w1", w1.worker_token(), 1).ok());
  // A member that never heartbeats again expires as usual.
  clock_.Advance(kTtl + absl::Seconds(1));
  EXPECT_THAT(state_->ExpireLeases(), ElementsAre("x/w1"));
}

TEST_F(CoordinatorDurabilityTest, AStoredMemberWithoutItsPlanIsPlannedOnOpen) {
  // A crash between a join's write and its plan's: the member is stored,
  // the plan of it is not.
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    StoredJob job;
    job.name = "x";
    job.spec =
        std::make_shared<const JobSpec>(*JobSpecFromProto(Create("x").job()));
    job.job_token = "t";
    job.data_plane_secret = "s";
    StoredWorker w;
    w.worker_id = "w1";
    w.join = JoinRequestFromProto(Join("x", "w1"));
    w.token = "wt";
    w.join_seq = 1;
    ASSERT_TRUE(
        (*store)
            ->Apply({store_op::PutJob{job}, store_op::PutWorker{"x", w}})
            .ok());
  }
  ASSERT_NO_FATAL_FAILURE(Restart());
  const v1::Plan plan = Current("x");
  EXPECT_EQ(plan.version(), 1);
  EXPECT_THAT(plan.workers(), ElementsAre("w1"));
  EXPECT_THAT(plan.reason(), HasSubstr("restarted"));
  ASSERT_NO_FATAL_FAILURE(Restart());  // and that plan was stored
  EXPECT_EQ(Current("x").version(), 1);
}

TEST_F(CoordinatorDurabilityTest, ASecondCoordinatorOnTheDirectoryIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Restart());
  const absl::StatusOr<std::unique_ptr<JobStore>> second = JobStore::Open(dir_);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(dir_));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
