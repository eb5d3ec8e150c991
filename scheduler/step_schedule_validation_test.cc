// What BuildStepSchedule (scheduler/step_schedule.h) refuses: non-positive
// bucket or stack bounds, and plans whose matrices, names, expert counts or
// owners do not match the model, each named in the message; and an empty
// model's empty schedule.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/planner.h"
#include "scheduler/step_schedule.h"
#include "scheduler/step_schedule_fixture.h"

namespace muonps {
namespace scheduler {
namespace {

using schedule_test::StepScheduleTest;
using ::testing::HasSubstr;

TEST_F(StepScheduleTest, RefusesANonPositiveStackBound) {
  ScheduleOptions options;
  options.stack_bytes = 0;
  absl::StatusOr<StepSchedule> schedule =
      BuildStepSchedule(matrices(), plan_, options);
  ASSERT_FALSE(schedule.ok());
  EXPECT_THAT(std::string(schedule.status().message()),
              HasSubstr("stack_bytes"));
}

TEST_F(StepScheduleTest, NonPositiveBucketBytesIsInvalidArgument) {
  for (const int64_t bound : {int64_t{0}, int64_t{-1}}) {
    ScheduleOptions options;
    options.bucket_bytes = bound;
    const absl::Status status =
        BuildStepSchedule(matrices(), plan_, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("bucket_bytes"));
  }
}

TEST_F(StepScheduleTest, PlanWithTooFewMatricesIsInvalidArgument) {
  OwnershipPlan shorter = plan_;
  shorter.owners.pop_back();
  shorter.matrix_names.pop_back();
  const absl::Status status = BuildStatus(shorter);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("plan.owners"));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(std::to_string(matrices().size())));

  OwnershipPlan names_only = plan_;
  names_only.matrix_names.pop_back();
  const absl::Status names = BuildStatus(names_only);
  EXPECT_EQ(names.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(names.message()), HasSubstr("plan.matrix_names"));
  EXPECT_THAT(std::string(names.message()),
              HasSubstr(std::to_string(matrices().size() - 1)));
}

TEST_F(StepScheduleTest, PlanForARenamedMatrixIsInvalidArgumentNamingIt) {
  OwnershipPlan renamed = plan_;
  renamed.matrix_names[2] = "layers.0.mlp.gate";
  const absl::Status status = BuildStatus(renamed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"layers.0.mlp.up\""));
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("\"layers.0.mlp.gate\""));
}

TEST_F(StepScheduleTest, PlanWithWrongExpertCountIsInvalidArgumentNamingIt) {
  for (const bool fewer : {true, false}) {
    SCOPED_TRACE(fewer ? "fewer" : "more");
    OwnershipPlan wrong = plan_;
    if (fewer) {
      wrong.owners[3].pop_back();
    } else {
      wrong.owners[3].push_back(0);
    }
    const absl::Status status = BuildStatus(wrong);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("\"layers.1.moe.experts\""));
  }
  // A single matrix given an expert dimension it does not have.
  OwnershipPlan two = plan_;
  two.owners[6].push_back(0);
  const absl::Status status = BuildStatus(two);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"head\""));
}

TEST_F(StepScheduleTest, OwnerOutsideTheWorkersIsInvalidArgumentNamingIt) {
  for (const int32_t owner : {3, -1, 1000}) {
    SCOPED_TRACE(owner);
    OwnershipPlan wrong = plan_;
    wrong.owners[7][2] = owner;
    const absl::Status status = BuildStatus(wrong);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("\"layers.0.moe.experts\""));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(std::to_string(owner)));
  }
}

TEST_F(StepScheduleTest, ExchangeNodesMustSplitTheWorkersEvenly) {
  OwnershipPlan nodes = plan_;
  nodes.exchange_nodes = {{0}, {1}, {2}};
  absl::StatusOr<StepSchedule> built =
      BuildStepSchedule(input_.matrices, nodes);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->exchange_nodes, nodes.exchange_nodes);
  const std::vector<std::pair<std::vector<std::vector<int32_t>>, std::string>>
      wrong = {{{{0, 1, 2}}, "one node"},
               {{{0, 1}, {2}}, "has 1 workers; the first has 2"},
               {{{0}, {0}, {2}}, "worker 0 is also in node 0"},
               {{{0}, {1}}, "worker 2 is in no node"},
               {{{0}, {1}, {5}}, "5 is not a worker index"}};
  for (const auto& [split, why] : wrong) {
    SCOPED_TRACE(why);
    nodes.exchange_nodes = split;
    const absl::Status status = BuildStatus(nodes);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("plan.exchange_nodes"));
    EXPECT_THAT(std::string(status.message()), HasSubstr(why));
  }
  nodes.exchange_nodes = {{0}, {1}, {2}};
  nodes.dedicated = 1;
  EXPECT_THAT(std::string(BuildStatus(nodes).message()),
              HasSubstr("dedicated workers"));
}

TEST(StepScheduleEmptyTest, NoMatricesGiveNoBucketsAndAnEmptyOrder) {
  OwnershipPlan plan;
  plan.worker_ids = {"w0", "w1"};
  absl::StatusOr<StepSchedule> schedule = BuildStepSchedule({}, plan);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_TRUE(schedule->buckets.empty());
  EXPECT_TRUE(schedule->order.empty());
  EXPECT_TRUE(IssueOrder(*schedule).empty());
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
