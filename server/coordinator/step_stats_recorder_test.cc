// StepStatsRecorder: the step stats workers report. Each figure is checked
// and the worker named; the coordinator keeps each worker's newest step (by
// step id) in its record and ListWorkers shows it beside the plan's
// prediction; an older or repeated step id, a refused report, or another
// worker's report leaves it alone, and it goes with the record when the
// worker leaves, expires or is replaced.
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_fixture.h"

namespace muonps {
namespace coordinator {
namespace coordinator_test {
namespace {

// A valid report of `step` by `worker` of job "x" under plan version 1, its
// figures derived from the step id so that reports are told apart.
v1::ReportStepStatsRequest Report(const std::string& worker, int64_t step) {
  v1::ReportStepStatsRequest r;
  r.set_job("x");
  r.set_worker_id(worker);
  r.set_step(step);
  r.set_plan_version(1);
  r.set_step_seconds(0.5 + step);
  r.set_ns_seconds(0.25 + step);
  r.set_predicted_ns_seconds(0.125 + step);
  r.set_bytes_moved(1000 + step);
  return r;
}

class StepStatsTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
    JoinOk("x", "w1");
  }

  // What ListWorkers shows for `worker` of job "x" (fails the test if it
  // lists no such worker).
  v1::WorkerInfo Listed(const std::string& worker) {
    v1::ListWorkersRequest request;
    request.set_job("x");
    absl::StatusOr<v1::ListWorkersResponse> list = state_->ListWorkers(request);
    EXPECT_TRUE(list.ok()) << list.status();
    if (list.ok()) {
      for (const v1::WorkerInfo& w : list->workers()) {
        if (w.worker_id() == worker) return w;
      }
    }
    ADD_FAILURE() << "ListWorkers lists no " << worker;
    return v1::WorkerInfo();
  }
};

// The figures of Report(worker, step).
void ExpectStep(const v1::WorkerInfo& info, int64_t step) {
  ASSERT_TRUE(info.has_last_step()) << info.worker_id();
  const v1::WorkerStepStats& s = info.last_step();
  EXPECT_EQ(s.step(), step);
  EXPECT_EQ(s.plan_version(), 1);
  EXPECT_EQ(s.step_seconds(), 0.5 + step);
  EXPECT_EQ(s.ns_seconds(), 0.25 + step);
  EXPECT_EQ(s.predicted_ns_seconds(), 0.125 + step);
  EXPECT_EQ(s.bytes_moved(), 1000 + step);
}

TEST_F(StepStatsTest, ListWorkersShowsTheNewestReportedStepOnly) {
  JoinOk("x", "w2");
  EXPECT_FALSE(Listed("w1").has_last_step());
  ASSERT_TRUE(state_->ReportStepStats(Report("w1", 7)).ok());
  ExpectStep(Listed("w1"), 7);
  // Another worker's report is its own.
  EXPECT_FALSE(Listed("w2").has_last_step());
  ASSERT_TRUE(state_->ReportStepStats(Report("w2", 3)).ok());
  ExpectStep(Listed("w2"), 3);
  ExpectStep(Listed("w1"), 7);

  // An older step id and the same one again are accepted and change
  // nothing.
  ASSERT_TRUE(state_->ReportStepStats(Report("w1", 6)).ok());
  v1::ReportStepStatsRequest again = Report("w1", 7);
  again.set_ns_seconds(99);
  ASSERT_TRUE(state_->ReportStepStats(again).ok());
  ExpectStep(Listed("w1"), 7);

  ASSERT_TRUE(state_->ReportStepStats(Report("w1", 8)).ok());
  ExpectStep(Listed("w1"), 8);
}

TEST_F(StepStatsTest, RefusedReportsChangeNothing) {
  ASSERT_TRUE(state_->ReportStepStats(Report("w1", 7)).ok());
  v1::ReportStepStatsRequest r = Report("w1", 8);
  r.set_predicted_ns_seconds(std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "predicted_ns_seconds: nan must be finite"));
  r = Report("w1", 8);
  r.set_predicted_ns_seconds(std::numeric_limits<double>::infinity());
  EXPECT_THAT(
      state_->ReportStepStats(r),
      StatusIs(absl::StatusCode::kInvalidArgument, "predicted_ns_seconds"));
  r = Report("w1", 8);
  r.set_plan_version(2);
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "plan_version"));
  r = Report("w1", 8);
  r.set_worker_token(std::string(64, 'f'));
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  EXPECT_THAT(state_->ReportStepStats(Report("w9", 8)),
              StatusIs(absl::StatusCode::kNotFound, "worker_id: \"w9\""));
  ExpectStep(Listed("w1"), 7);
}

TEST_F(StepStatsTest, StatsGoWithTheRecordOfAWorkerThatLeft) {
  ASSERT_TRUE(state_->ReportStepStats(Report("w1", 7)).ok());
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w1")).ok());
  // Rejoining starts a fresh record: nothing reported yet.
  const int64_t version = JoinOk("x", "w1");
  EXPECT_FALSE(Listed("w1").has_last_step());
  // Even a lower step id than the departed record's is the newest now.
  v1::ReportStepStatsRequest r = Report("w1", 2);
  r.set_plan_version(version);
  ASSERT_TRUE(state_->ReportStepStats(r).ok());
  EXPECT_EQ(Listed("w1").last_step().step(), 2);
}

TEST_F(StepStatsTest, StatsGoWithTheRecordOfAnExpiredOrReplacedWorker) {
  ASSERT_TRUE(state_->ReportStepStats(Report("w1", 7)).ok());
  // A new instance takes the id over once the lease has run out.
  clock_.Advance(kTtl + absl::Seconds(1));
  ASSERT_TRUE(
      state_->JoinJob(Join("x", "w1", 4 * kGiB, "another-instance")).ok());
  EXPECT_FALSE(Listed("w1").has_last_step());

  ASSERT_TRUE(state_->ReportStepStats(Report("w1", 9)).ok());
  clock_.Advance(kTtl + absl::Seconds(1));
  EXPECT_THAT(state_->ExpireLeases(), ::testing::ElementsAre("x/w1"));
  JoinOk("x", "w1");
  EXPECT_FALSE(Listed("w1").has_last_step());
}

TEST_F(CoordinatorTest, ReportStepStatsValidatesStepTimesAndWorker) {
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

}  // namespace
}  // namespace coordinator_test
}  // namespace coordinator
}  // namespace muonps
