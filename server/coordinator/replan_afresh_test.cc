// When the coordinator keeps owners on a re-plan: before any worker has
// reported a step there is no momentum, so a re-plan for joined workers is
// fresh (scheduler::PlanAfresh: the plan depends on the workers, not on
// the versions before it); once a step is reported, or a worker is lost,
// re-plans keep owners (scheduler::Replan).
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_fixture.h"

namespace muonps {
namespace coordinator {
namespace coordinator_test {
namespace {

// 24 matrices of three shapes (their Newton-Schulz costs differ), one per
// layer.
v1::JobSpec MixedSpec() {
  v1::JobSpec spec = Spec("x", 24);
  for (int i = 0; i < spec.matrices_size(); ++i) {
    v1::Matrix* m = spec.mutable_matrices(i);
    m->set_rows(i % 3 == 0 ? 1024 : i % 3 == 1 ? 512 : 2048);
    m->set_cols(i % 3 == 2 ? 1024 : 2048);
  }
  return spec;
}

// Owner of each matrix in `plan`.
std::map<std::string, std::string> Owners(const v1::Plan& plan) {
  std::map<std::string, std::string> out;
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    out[m.name()] = m.owners(0);
  }
  return out;
}

class ReplanAfreshTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(state_->CreateJob(Create(MixedSpec())).ok());
    for (const char* w : {"w1", "w2", "w3", "w4"}) JoinOk("x", w);
  }
  // w4 leaves, then joins again: the versions for 3 and then 4 workers.
  void LeaveAndRejoinW4(v1::Plan* three, v1::Plan* four) {
    ASSERT_TRUE(state_->LeaveJob(Leave("x", "w4")).ok());
    *three = CurrentPlan("x");
    JoinOk("x", "w4");
    *four = CurrentPlan("x");
  }
};

TEST_F(ReplanAfreshTest, BeforeAnyStepAJoinRePlansFromScratch) {
  const v1::Plan joined = CurrentPlan("x");
  ASSERT_EQ(joined.workers_size(), 4);
  v1::Plan three, four;
  ASSERT_NO_FATAL_FAILURE(LeaveAndRejoinW4(&three, &four));
  EXPECT_EQ(four.version(), joined.version() + 2);
  // w4's leave kept the survivors' owners; its join is planned afresh:
  // the same workers in the same rank order get the same plan, whatever
  // came between, its moved bytes counted against the version before.
  EXPECT_EQ(Owners(four), Owners(joined));
  EXPECT_EQ(four.max_seconds(), joined.max_seconds());
  EXPECT_GT(four.moved_bytes(), 0);
}

TEST_F(ReplanAfreshTest, AfterAReportedStepRePlansKeepOwners) {
  v1::ReportStepStatsRequest stats;
  stats.set_job("x");
  stats.set_worker_id("w1");
  stats.set_step(0);
  stats.set_plan_version(CurrentPlan("x").version());
  ASSERT_TRUE(state_->ReportStepStats(stats).ok());
  const v1::Plan before = CurrentPlan("x");
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w4")).ok());
  const v1::Plan after = CurrentPlan("x");
  // Every matrix w1..w3 held stays with it (the 24 matrices spread over
  // three workers within the planner's tolerance without moving them).
  int64_t w4_bytes = 0;
  const std::map<std::string, std::string> was = Owners(before);
  const std::map<std::string, std::string> now = Owners(after);
  int kept = 0, survivors = 0;
  for (const v1::MatrixPlacement& m : before.matrices()) {
    if (was.at(m.name()) == "w4") {
      w4_bytes += m.rows() * m.cols() * 4;  // fp32 momentum
      continue;
    }
    ++survivors;
    kept += now.at(m.name()) == was.at(m.name());
  }
  EXPECT_GE(after.moved_bytes(), w4_bytes);
  EXPECT_LE(after.moved_bytes(), 2 * w4_bytes);
  EXPECT_GE(4 * kept, 3 * survivors) << kept << " of " << survivors;
}

}  // namespace
}  // namespace coordinator_test
}  // namespace coordinator
}  // namespace muonps
