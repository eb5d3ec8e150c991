// OwnerStack::chunks (scheduler/step_schedule.h): a plan batch's parts laid
// over its owner's stacks of that shape in compute order, and the checks
// that a plan's batches agree with its owners.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace scheduler {
namespace {

using ::testing::HasSubstr;

// Bytes of one 64 x 128 fp32 matrix (momentum-sized: what stack_bytes
// counts).
constexpr int64_t kItemBytes = 64 * 128 * 4;

// Five matrices of one shape up to orientation on layers 0..4 (m4 is the
// transposed one), all owned by w0 of two workers, in one batch split into
// 2 Gram + 3 NS5.
class StackChunksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int m = 0; m < 5; ++m) {
      MatrixSpec spec;
      spec.name = absl::StrCat("m", m);
      spec.rows = m == 4 ? 128 : 64;
      spec.cols = m == 4 ? 64 : 128;
      spec.layer = m;
      matrices_.push_back(spec);
      plan_.matrix_names.push_back(spec.name);
      plan_.owners.push_back({0});
    }
    plan_.worker_ids = {"w0", "w1"};
    Batch batch;
    batch.worker = 0;
    batch.rows = 64;
    batch.cols = 128;
    for (int32_t m = 0; m < 5; ++m) batch.items.push_back({m, 0});
    batch.parts = {{2, NsAlgorithm::kGram, 0.002},
                   {3, NsAlgorithm::kNs5, 0.003}};
    batch.seconds = 0.005;
    plan_.batches.push_back(batch);
  }

  // Stacks of at most two matrices: m4 alone (its own orientation), then
  // [m3, m2] and [m1, m0] in arrival order (highest layer first).
  absl::StatusOr<StepSchedule> Build() {
    return BuildStepSchedule(matrices_, plan_, {.stack_bytes = 2 * kItemBytes});
  }

  std::vector<MatrixSpec> matrices_;
  OwnershipPlan plan_;
};

std::string Describe(const OwnerStack& stack) {
  std::string out;
  for (const StackChunk& c : stack.chunks) {
    absl::StrAppend(&out, out.empty() ? "" : " ", c.count,
                    NsAlgorithmName(c.algorithm));
  }
  return out;
}

std::vector<std::string> DescribeAll(const StepSchedule& schedule) {
  std::vector<std::string> out;
  for (const OwnerStack& stack : schedule.stacks) {
    out.push_back(Describe(stack));
  }
  return out;
}

TEST_F(StackChunksTest, PartsAreLaidOverTheStacksInComputeOrder) {
  const absl::StatusOr<StepSchedule> schedule = Build();
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  ASSERT_EQ(schedule->stacks.size(), 3u);
  EXPECT_EQ(schedule->stacks[0].rows, 128);
  EXPECT_EQ(schedule->stacks[0].items.size(), 1u);
  EXPECT_EQ(schedule->stacks[1].items.size(), 2u);
  EXPECT_EQ(schedule->stacks[2].items.size(), 2u);
  // The Gram part covers m4 and m3; it ends inside the second stack, which
  // is cut there into chunks of its two parts.
  EXPECT_THAT(DescribeAll(*schedule),
              ::testing::ElementsAre("1gram", "1gram 1ns5", "2ns5"));
}

TEST_F(StackChunksTest, OneStackHoldingTheBatchRunsExactlyTheParts) {
  const absl::StatusOr<StepSchedule> schedule =
      BuildStepSchedule(matrices_, plan_);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  // m4 stacks apart by orientation: 1 Gram, then the other four.
  EXPECT_THAT(DescribeAll(*schedule),
              ::testing::ElementsAre("1gram", "1gram 3ns5"));
  // Upright, m4 joins the others: one stack, the parts themselves.
  matrices_[4].rows = 64;
  matrices_[4].cols = 128;
  const absl::StatusOr<StepSchedule> upright =
      BuildStepSchedule(matrices_, plan_);
  ASSERT_TRUE(upright.ok()) << upright.status();
  EXPECT_THAT(DescribeAll(*upright), ::testing::ElementsAre("2gram 3ns5"));
}

TEST_F(StackChunksTest, TaperedStacksRunTheirPartsInSmallerChunks) {
  // 4096 x 8192 (128 MiB of fp32 each), all upright: the one stack of five
  // tapers, on two workers, into 3, 1 and 1 matrices, the parts laid over
  // them in compute order; one worker runs the parts themselves.
  for (MatrixSpec& m : matrices_) {
    m.rows = 4096;
    m.cols = 8192;
  }
  plan_.batches[0].rows = 4096;
  plan_.batches[0].cols = 8192;
  const absl::StatusOr<StepSchedule> schedule =
      BuildStepSchedule(matrices_, plan_);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_THAT(DescribeAll(*schedule),
              ::testing::ElementsAre("2gram 1ns5", "1ns5", "1ns5"));
  plan_.worker_ids = {"w0"};
  const absl::StatusOr<StepSchedule> alone =
      BuildStepSchedule(matrices_, plan_);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_THAT(DescribeAll(*alone), ::testing::ElementsAre("2gram 3ns5"));
}

TEST_F(StackChunksTest, StacksWithoutABatchAreOneNs5Chunk) {
  plan_.batches.clear();
  const absl::StatusOr<StepSchedule> schedule = Build();
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  EXPECT_THAT(DescribeAll(*schedule),
              ::testing::ElementsAre("1ns5", "2ns5", "2ns5"));
}

TEST_F(StackChunksTest, BatchesThatDisagreeWithTheOwnersAreInvalidArgument) {
  struct Case {
    std::string what;
    std::function<void(OwnershipPlan*)> edit;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"parts short", [](OwnershipPlan* p) { p->batches[0].parts.pop_back(); },
       "parts cover 2 of 5"},
      {"no parts", [](OwnershipPlan* p) { p->batches[0].parts.clear(); },
       "has no parts"},
      {"empty part", [](OwnershipPlan* p) { p->batches[0].parts[0].count = 0; },
       "plan.batches[0].parts[0]: count 0"},
      {"parts over", [](OwnershipPlan* p) { p->batches[0].parts[1].count = 4; },
       "plan.batches[0].parts[1]: count 4"},
      {"item of another owner", [](OwnershipPlan* p) { p->owners[2] = {1}; },
       "\"m2\" expert 0 is not of 64x128 on worker 0"},
      {"item missing", [](OwnershipPlan* p) { p->batches[0].items.pop_back(); },
       "lists 4 matrices of 64x128 on worker 0; it owns 5"},
      {"second batch",
       [](OwnershipPlan* p) { p->batches.push_back(p->batches[0]); },
       "plan.batches[1]: a second batch of 64x128 on worker 0"},
      {"worker", [](OwnershipPlan* p) { p->batches[0].worker = 2; },
       "worker 2 is not a worker index"},
      {"bad item", [](OwnershipPlan* p) { p->batches[0].items[0].expert = 1; },
       "item (0, 1) is not a matrix expert"},
      {"item twice, another in none",
       [](OwnershipPlan* p) {
         p->batches[0].items.back() = p->batches[0].items.front();
       },
       "plan.batches: matrix \"m4\" expert 0 is missing from its owner's "
       "batch"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    OwnershipPlan wrong = plan_;
    c.edit(&wrong);
    const absl::Status status = BuildStepSchedule(matrices_, wrong).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
