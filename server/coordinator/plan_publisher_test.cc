// CoordinatorState's published plans (coordinator_published_plans.cc):
// GetPlan before any worker and of pruned or future versions, WaitForPlan
// returning, timing out and waking, the NCCL ids rank 0 puts and its peers
// get, and the step stats workers report.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_state.h"
#include "server/coordinator/coordinator_state_fixture.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::CoordinatorStateTest;
using coordinator_test::Create;
using coordinator_test::PlanOf;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(CoordinatorStateTest,
       GetPlanBeforeAnyWorkerIsFailedPreconditionNoWorker) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  const absl::Status status = state_->GetPlan(PlanOf("x")).status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, "\"x\""));
  EXPECT_THAT(std::string(status.message()), HasSubstr("no worker"));
}

TEST_F(CoordinatorStateTest, GetPlanReportsPrunedAndFutureVersionsAsNotFound) {
  CoordinatorOptions options = Options();
  options.plan_history = 3;
  Reset(options);
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 8))).ok());
  for (int i = 1; i <= 5; ++i) EXPECT_EQ(JoinOk("x", absl::StrCat("w", i)), i);
  EXPECT_THAT(state_->GetPlan(PlanOf("x", 1)).status(),
              StatusIs(absl::StatusCode::kNotFound, "pruned"));
  EXPECT_THAT(state_->GetPlan(PlanOf("x", 2)).status(),
              StatusIs(absl::StatusCode::kNotFound, "oldest kept is 3"));
  for (int64_t version : {3, 4, 5}) {
    EXPECT_TRUE(state_->GetPlan(PlanOf("x", version)).ok()) << version;
  }
  EXPECT_THAT(state_->GetPlan(PlanOf("x", 99)).status(),
              StatusIs(absl::StatusCode::kNotFound, "does not exist yet"));
  EXPECT_THAT(state_->GetPlan(PlanOf("x", -1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "version"));
}

TEST_F(CoordinatorStateTest, WaitForPlanReturnsAtOnceWhenNewerVersionExists) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 0, absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->has_value());
  EXPECT_EQ((*plan)->version(), 1);
}

TEST_F(CoordinatorStateTest, WaitForPlanTimesOutWithNulloptWhenNothingChanges) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 1, absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->has_value());
  EXPECT_THAT(state_->WaitForPlan("nope", 0, absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"nope\""));
}

TEST_F(CoordinatorStateTest,
       WaitForPlanSendsTheCurrentPlanAtOnceToAWatcherAheadOfTheJob) {
  // A worker that followed version 7 of a job this coordinator no longer
  // knows (it restarted without its state, and the job was created again)
  // must get the current plan, not wait for a version above 7.
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 7, absl::Milliseconds(200));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->has_value()) << "timed out instead of sending version 2";
  EXPECT_EQ((*plan)->version(), 2);
  // A watcher on the current version still waits.
  plan = state_->WaitForPlan("x", 2, absl::Milliseconds(10));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->has_value());
}

TEST_F(CoordinatorStateTest, WaitForPlanWakesWhenAnotherThreadJoinsAWorker) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  std::thread joiner([this] {
    absl::SleepFor(absl::Milliseconds(50));
    JoinOk("x", "w2");
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 1, absl::Seconds(2));
  const absl::Duration waited = absl::Now() - start;
  joiner.join();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->has_value()) << "timed out after " << waited;
  EXPECT_EQ((*plan)->version(), 2);
  EXPECT_THAT((*plan)->workers(), ElementsAre("w1", "w2"));
  EXPECT_LT(waited, absl::Seconds(2));
}

TEST_F(CoordinatorStateTest,
       WaitForPlanIsNotFoundWhenJobIsDeletedWhileWaiting) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  std::thread deleter([this] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(state_->DeleteJob("x").ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 1, absl::Seconds(2));
  const absl::Duration waited = absl::Now() - start;
  deleter.join();
  EXPECT_THAT(plan.status(), StatusIs(absl::StatusCode::kNotFound, "\"x\""));
  EXPECT_LT(waited, absl::Seconds(2));
}

class NcclIdTest : public CoordinatorStateTest {
 protected:
  NcclIdTest() {
    EXPECT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
    JoinOk("x", "w1");
    JoinOk("x", "w2");
    const v1::Plan plan = CurrentPlan("x");
    rank0_ = plan.workers_size() > 0 ? plan.workers(0) : "";
    other_ = rank0_ == "w1" ? "w2" : "w1";
  }
  static std::string Id(char seed) {
    std::string id(128, '\0');  // binary, NULs included
    for (size_t i = 0; i < id.size(); i += 3)
      id[i] = static_cast<char>(seed + i);
    return id;
  }
  absl::Status Put(int64_t version, const std::string& worker,
                   const std::string& id, int64_t generation = 0) {
    v1::PutNcclIdRequest r;
    r.set_job("x");
    r.set_plan_version(version);
    r.set_worker_id(worker);
    r.set_nccl_id(id);
    r.set_generation(generation);
    return state_->PutNcclId(r);
  }
  absl::StatusOr<v1::GetNcclIdResponse> Get(int64_t version,
                                            int64_t min_generation = 0) {
    v1::GetNcclIdRequest r;
    r.set_job("x");
    r.set_worker_id(other_);
    r.set_plan_version(version);
    r.set_min_generation(min_generation);
    return state_->GetNcclId(r);
  }

  std::string rank0_;
  std::string other_;
};

TEST_F(NcclIdTest, RankZeroPutsOnceForCurrentVersionAndOthersGetIt) {
  ASSERT_EQ(rank0_, "w1");  // rank order is join order
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kNotFound, "not put it"));
  EXPECT_THAT(Put(2, rank0_, Id('a').substr(0, 127)),
              StatusIs(absl::StatusCode::kInvalidArgument, "nccl_id"));
  EXPECT_THAT(Put(2, rank0_, Id('a') + "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "129 bytes"));
  EXPECT_THAT(Put(1, rank0_, Id('a')),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  const absl::Status not_rank0 = Put(2, other_, Id('a'));
  EXPECT_THAT(not_rank0,
              StatusIs(absl::StatusCode::kFailedPrecondition, "rank 0"));
  EXPECT_THAT(std::string(not_rank0.message()),
              HasSubstr(absl::StrCat("\"", rank0_, "\"")));
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kNotFound, "nccl_id"));

  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  EXPECT_TRUE(Put(2, rank0_, Id('a')).ok());  // same id again: a no-op
  EXPECT_THAT(Put(2, rank0_, Id('b')),
              StatusIs(absl::StatusCode::kAlreadyExists, "nccl_id"));
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('a'));
  EXPECT_THAT(Get(1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
}

TEST_F(NcclIdTest, ACommunicatorRebuiltWithinAVersionGetsTheNextGeneration) {
  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  // The others ask for a newer one than the broken communicator's.
  EXPECT_THAT(Get(2, 1).status(),
              StatusIs(absl::StatusCode::kNotFound, "generation >= 1"));
  ASSERT_TRUE(Put(2, rank0_, Id('b'), 1).ok());
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(2, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('b'));
  EXPECT_EQ(got->generation(), 1);
  // A late rank asking for any generation gets the newest.
  EXPECT_EQ(Get(2, 0)->nccl_id(), Id('b'));
  // Going back is refused; the same generation keeps its id.
  EXPECT_THAT(Put(2, rank0_, Id('c'), 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, "generation"));
  EXPECT_THAT(Put(2, rank0_, Id('c'), 1),
              StatusIs(absl::StatusCode::kAlreadyExists, "nccl_id"));
  EXPECT_THAT(Put(2, rank0_, Id('c'), -1),
              StatusIs(absl::StatusCode::kInvalidArgument, "generation"));
}

TEST_F(NcclIdTest, OldVersionsIdIsNotReturnedForNewVersion) {
  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  EXPECT_EQ(JoinOk("x", "w3"), 3);
  EXPECT_THAT(Get(3).status(),
              StatusIs(absl::StatusCode::kNotFound, "nccl_id"));
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  EXPECT_THAT(Put(2, rank0_, Id('a')),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  const std::string rank0_v3 = CurrentPlan("x").workers(0);
  ASSERT_TRUE(Put(3, rank0_v3, Id('c')).ok());
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(3);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('c'));
}

TEST_F(CoordinatorStateTest, ReportStepStatsValidatesStepTimesAndWorker) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  v1::ReportStepStatsRequest valid;
  valid.set_job("x");
  valid.set_worker_id("w1");
  valid.set_step(7);
  valid.set_plan_version(1);
  valid.set_step_seconds(0.25);
  valid.set_ns_seconds(0.125);
  valid.set_bytes_moved(1 << 20);
  EXPECT_TRUE(state_->ReportStepStats(valid).ok());

  v1::ReportStepStatsRequest r = valid;
  r.set_step(-1);
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "step: "));
  r = valid;
  r.set_step_seconds(std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "step_seconds"));
  r = valid;
  r.set_ns_seconds(std::numeric_limits<double>::infinity());
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "ns_seconds"));
  r = valid;
  r.set_predicted_ns_seconds(-0.5);
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "predicted_ns_seconds: -0.5"));
  r = valid;
  r.set_bytes_moved(-1);
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "bytes_moved"));
  r = valid;
  r.set_worker_id("w9");
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kNotFound, "\"w9\""));
  r = valid;
  r.set_job("y");
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kNotFound, "\"y\""));
}

TEST_F(NcclIdTest, OnlyRankZeroWithItsOwnTokenPutsAndOnlyMembersGet) {
  v1::PutNcclIdRequest put;
  put.set_job("x");
  put.set_plan_version(2);
  put.set_worker_id(rank0_);
  put.set_nccl_id(Id('a'));
  // Naming rank 0 with another worker's token does not make one rank 0.
  put.set_worker_token(state_->worker_token("x", other_));
  EXPECT_THAT(state_->PutNcclId(put),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  put.set_worker_token(state_->worker_token("x", rank0_));
  ASSERT_TRUE(state_->PutNcclId(put).ok());

  v1::GetNcclIdRequest get;
  get.set_job("x");
  get.set_plan_version(2);
  get.set_worker_id(other_);
  get.set_worker_token("ffffffffffffffffffffffffffffffff");
  EXPECT_THAT(state_->GetNcclId(get).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  get.set_worker_id("stranger");
  get.clear_worker_token();
  EXPECT_THAT(state_->GetNcclId(get).status(),
              StatusIs(absl::StatusCode::kNotFound, "worker_id"));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
