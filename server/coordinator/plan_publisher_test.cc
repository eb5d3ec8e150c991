// PlanPublisher's published plans as workers read them: GetPlan before any
// worker and of pruned or future versions, WaitForPlan returning, timing
// out and waking.
#include <cstdint>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_fixture.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::PlanOf;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(CoordinatorTest, GetPlanBeforeAnyWorkerIsFailedPreconditionNoWorker) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  const absl::Status status = state_->GetPlan(PlanOf("x")).status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, "\"x\""));
  EXPECT_THAT(std::string(status.message()), HasSubstr("no worker"));
}

TEST_F(CoordinatorTest, GetPlanReportsPrunedAndFutureVersionsAsNotFound) {
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

TEST_F(CoordinatorTest, WaitForPlanReturnsAtOnceWhenNewerVersionExists) {
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

TEST_F(CoordinatorTest, WaitForPlanTimesOutWithNulloptWhenNothingChanges) {
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

TEST_F(CoordinatorTest,
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

TEST_F(CoordinatorTest, WaitForPlanWakesWhenAnotherThreadJoinsAWorker) {
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

TEST_F(CoordinatorTest, WaitForPlanIsNotFoundWhenJobIsDeletedWhileWaiting) {
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

}  // namespace
}  // namespace coordinator
}  // namespace muonps
