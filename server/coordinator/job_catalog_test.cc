// JobCatalog: creating jobs (retries, name clashes, limits, bad specs),
// reading them back as they were declared, listing and counting them, and
// deleting them with the job's own token.
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_fixture.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::Beat;
using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::Leave;
using coordinator_test::PlanOf;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::IsEmpty;

TEST_F(CoordinatorTest, CreateJobReturnsJobsSlashNameAtPlanVersionZero) {
  absl::StatusOr<v1::Job> job = state_->CreateJob(Create(Spec("x", 2), "r1"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name(), "jobs/x");
  EXPECT_EQ(job->plan_version(), 0);
  EXPECT_THAT(job->workers(), IsEmpty());
  EXPECT_EQ(job->spec().matrices_size(), 2);
  EXPECT_EQ(job->create_time_ms(), int64_t{1700000000} * 1000);
  absl::StatusOr<v1::Job> got = state_->GetJob("x");
  ASSERT_TRUE(got.ok()) << got.status();
  v1::Job without_token = *job;
  without_token.clear_job_token();  // CreateJob's answer alone holds it
  EXPECT_EQ(got->DebugString(), without_token.DebugString());
}

TEST_F(CoordinatorTest, CreateJobRetryWithSameRequestIdReturnsSameJob) {
  absl::StatusOr<v1::Job> first = state_->CreateJob(Create(Spec("x", 2), "r1"));
  ASSERT_TRUE(first.ok()) << first.status();
  clock_.Advance(absl::Seconds(3));
  absl::StatusOr<v1::Job> retry = state_->CreateJob(Create(Spec("x", 2), "r1"));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->DebugString(), first->DebugString());
  EXPECT_EQ(state_->Counts().jobs, 1);
}

TEST_F(CoordinatorTest,
       CreateJobOfExistingNameWithOtherRequestIsAlreadyExists) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2), "r1")).ok());
  EXPECT_THAT(state_->CreateJob(Create(Spec("x", 2), "r2")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "job.name"));
  // Without a request_id a second create is not a retry.
  ASSERT_TRUE(state_->CreateJob(Create(Spec("y", 1))).ok());
  EXPECT_THAT(state_->CreateJob(Create(Spec("y", 1))).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "\"y\""));
}

TEST_F(CoordinatorTest, CreateJobBeyondMaxJobsIsResourceExhausted) {
  CoordinatorOptions options = Options();
  options.limits.max_jobs = 2;
  Reset(options);
  ASSERT_TRUE(state_->CreateJob(Create(Spec("a", 1), "ra")).ok());
  ASSERT_TRUE(state_->CreateJob(Create(Spec("b", 1))).ok());
  EXPECT_THAT(state_->CreateJob(Create(Spec("c", 1))).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit of 2"));
  EXPECT_TRUE(state_->CreateJob(Create(Spec("a", 1), "ra")).ok());  // retry
  ASSERT_TRUE(state_->DeleteJob("b").ok());
  EXPECT_TRUE(state_->CreateJob(Create(Spec("c", 1))).ok());
}

TEST_F(CoordinatorTest, CreateJobWithBadSpecOrLongRequestIdCreatesNothing) {
  v1::JobSpec bad = Spec("x", 3);
  bad.mutable_matrices(2)->set_rows(0);
  EXPECT_THAT(
      state_->CreateJob(Create(bad)).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "job.matrices[2].rows"));
  EXPECT_THAT(
      state_->CreateJob(Create(Spec("x", 1), std::string(65, 'r'))).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "request_id"));
  EXPECT_EQ(state_->Counts().jobs, 0);
  EXPECT_THAT(state_->GetJob("x").status(),
              StatusIs(absl::StatusCode::kNotFound, "\"x\""));
}

TEST_F(CoordinatorTest, ListJobsCountsExpertsAsMatricesAndSumsParameters) {
  v1::JobSpec spec = Spec("moe", 1, 64, 32);
  v1::Matrix* experts = spec.add_matrices();
  experts->set_name("layers.1.experts");
  experts->set_rows(16);
  experts->set_cols(8);
  experts->set_experts(4);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  ASSERT_TRUE(state_->CreateJob(Create(Spec("dense", 3, 10, 10))).ok());
  JoinOk("moe", "w1");
  const v1::ListJobsResponse list = state_->ListJobs();
  ASSERT_EQ(list.jobs_size(), 2);
  const v1::JobSummary& dense = list.jobs(0);  // jobs are sorted by name
  EXPECT_EQ(dense.name(), "dense");
  EXPECT_EQ(dense.matrices(), 3);
  EXPECT_EQ(dense.parameters(), 300);
  EXPECT_EQ(dense.workers(), 0);
  const v1::JobSummary& moe = list.jobs(1);
  EXPECT_EQ(moe.name(), "moe");
  EXPECT_EQ(moe.matrices(), 1 + 4);
  EXPECT_EQ(moe.parameters(), 64 * 32 + 4 * 16 * 8);
  EXPECT_EQ(moe.workers(), 1);
  EXPECT_EQ(moe.plan_version(), 1);
}

TEST_F(CoordinatorTest, JobTooLargeToCountIsRejectedOrListedWithoutOverflow) {
  // 128 stacks of 65536 experts of 2^20 x 2^20 pass every per-matrix limit
  // but hold 128 * 2^56 = 2^63 parameters, one more than int64 holds.
  v1::JobSpec spec = Spec("huge", 128, int64_t{1} << 20, int64_t{1} << 20);
  for (v1::Matrix& m : *spec.mutable_matrices()) m.set_experts(65536);
  absl::StatusOr<v1::Job> job = state_->CreateJob(Create(spec));
  if (!job.ok()) {
    EXPECT_TRUE(job.status().code() == absl::StatusCode::kInvalidArgument ||
                job.status().code() == absl::StatusCode::kResourceExhausted)
        << job.status();
    return;
  }
  const v1::ListJobsResponse list = state_->ListJobs();
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).matrices(), 128 * 65536);
  EXPECT_GT(list.jobs(0).parameters(), 0)
      << "the parameter count overflowed int64";
}

TEST_F(CoordinatorTest, CountsTrackJobsWorkersAndPublishedVersions) {
  EXPECT_EQ(state_->Counts().jobs, 0);
  ASSERT_TRUE(state_->CreateJob(Create(Spec("a", 4))).ok());
  ASSERT_TRUE(state_->CreateJob(Create(Spec("b", 4))).ok());
  JoinOk("a", "w1");
  JoinOk("a", "w2");
  JoinOk("b", "w1");
  StateCounts counts = state_->Counts();
  EXPECT_EQ(counts.jobs, 2);
  EXPECT_EQ(counts.workers, 3);
  EXPECT_EQ(counts.plan_versions, 3);
  ASSERT_TRUE(state_->LeaveJob(Leave("a", "w2")).ok());
  counts = state_->Counts();
  EXPECT_EQ(counts.workers, 2);
  EXPECT_EQ(counts.plan_versions, 4);
  ASSERT_TRUE(state_->DeleteJob("a").ok());
  counts = state_->Counts();
  EXPECT_EQ(counts.jobs, 1);
  EXPECT_EQ(counts.workers, 1);
  // A running total (it feeds muonps_coordinator_plan_versions_total).
  EXPECT_EQ(counts.plan_versions, 4);
}

TEST_F(CoordinatorTest,
       DeletedJobIsNotFoundAndItsNameContinuesItsPlanVersions) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  ASSERT_TRUE(state_->DeleteJob("x").ok());
  EXPECT_THAT(state_->GetJob("x").status(),
              StatusIs(absl::StatusCode::kNotFound, "\"x\" does not exist"));
  EXPECT_THAT(state_->Heartbeat(Beat("x", "w1", 1)).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"x\""));
  EXPECT_THAT(state_->GetPlan(PlanOf("x")).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"x\""));
  EXPECT_THAT(state_->DeleteJob("x"),
              StatusIs(absl::StatusCode::kNotFound, "\"x\""));
  EXPECT_THAT(state_->ListJobs().jobs(), IsEmpty());
  EXPECT_THAT(state_->DeleteJob("bad/name"),
              StatusIs(absl::StatusCode::kInvalidArgument, "job"));
  // The name is free again; its versions continue after the deleted job's,
  // so a worker still on the old job's plan never takes the new job's for
  // an older one.
  absl::StatusOr<v1::Job> again = state_->CreateJob(Create(Spec("x", 2)));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->plan_version(), 1);
  EXPECT_EQ(JoinOk("x", "w1"), 2);
}

TEST_F(CoordinatorTest, DeleteJobNeedsTheJobsOwnToken) {
  absl::StatusOr<v1::Job> x = state_->CreateJob(Create(Spec("x", 2), "r"));
  absl::StatusOr<v1::Job> y = state_->CreateJob(Create(Spec("y", 2)));
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->job_token().size(), 64u);
  // GetJob never shows it; a retry of the create does.
  EXPECT_EQ(state_->GetJob("x")->job_token(), "");
  EXPECT_EQ(state_->CreateJob(Create(Spec("x", 2), "r"))->job_token(),
            x->job_token());
  v1::DeleteJobRequest r;
  r.set_job("x");
  EXPECT_THAT(state_->DeleteJob(r),
              StatusIs(absl::StatusCode::kUnauthenticated, "job_token"));
  r.set_job_token(y->job_token());
  EXPECT_THAT(state_->DeleteJob(r),
              StatusIs(absl::StatusCode::kUnauthenticated, "job_token"));
  EXPECT_TRUE(state_->GetJob("x").ok());
  r.set_job_token(x->job_token());
  EXPECT_TRUE(state_->DeleteJob(r).ok());
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
