// What the StepSchedule tests share (scheduler/step_schedule.h): a small
// model's matrices (ModelMatrices) planned over three workers in the
// StepScheduleTest fixture, the bucket bound they are built with, and
// Describe, a transfer in one line. Tests only (testonly in BUILD).
#ifndef MUONPS_SCHEDULER_STEP_SCHEDULE_FIXTURE_H_
#define MUONPS_SCHEDULER_STEP_SCHEDULE_FIXTURE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/planner.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace scheduler {
namespace schedule_test {

constexpr int64_t kMiB = int64_t{1} << 20;

inline MatrixSpec Matrix(std::string name, int64_t rows, int64_t cols,
                         DType dtype, Layout layout, int32_t layer,
                         int64_t experts = 1) {
  MatrixSpec m;
  m.name = std::move(name);
  m.rows = rows;
  m.cols = cols;
  m.dtype = dtype;
  m.layout = layout;
  m.layer = layer;
  m.experts = experts;
  return m;
}

// A small model in registration order (not layer order), every layout, two
// expert stacks, and two matrices larger than kBucketBytes.
inline std::vector<MatrixSpec> ModelMatrices() {
  return {
      Matrix("embed", 1024, 512, DType::kFloat32, Layout::kReplicated, 0),
      Matrix("layers.0.attn.qkv", 512, 1536, DType::kBFloat16,
             Layout::kUnreduced, 1),
      Matrix("layers.0.mlp.up", 512, 2048, DType::kBFloat16,
             Layout::kRowSharded, 1),
      Matrix("layers.1.moe.experts", 256, 512, DType::kBFloat16,
             Layout::kRowSharded, 2, /*experts=*/4),
      Matrix("layers.1.attn.qkv", 512, 1536, DType::kBFloat16,
             Layout::kUnreduced, 2),
      Matrix("layers.1.mlp.down", 2048, 512, DType::kFloat32,
             Layout::kReplicated, 2),
      Matrix("head", 512, 4096, DType::kBFloat16, Layout::kReplicated, 3),
      Matrix("layers.0.moe.experts", 128, 256, DType::kFloat32,
             Layout::kUnreduced, 1, /*experts=*/3),
  };
}

// 3 MiB: "head" and "layers.1.mlp.down" (4 MiB each) exceed it; several
// smaller matrices share buckets.
constexpr int64_t kBucketBytes = 3 * kMiB;

inline std::string Describe(const Transfer& t) {
  return absl::StrCat(TransferKindName(t.kind), " m", t.item.matrix, " e",
                      t.item.expert, " owner ", t.owner, " bytes ", t.bytes);
}

inline std::vector<std::string> Describe(
    const std::vector<Transfer>& transfers) {
  std::vector<std::string> out;
  for (const Transfer& t : transfers) out.push_back(Describe(t));
  return out;
}

class StepScheduleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    input_.matrices = ModelMatrices();
    for (const char* id : {"w0", "w1", "w2"}) {
      WorkerSpec worker;
      worker.id = id;
      input_.workers.push_back(worker);
    }
    absl::StatusOr<OwnershipPlan> plan = PlanOwnership(input_);
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *std::move(plan);
    ASSERT_EQ(plan_.worker_ids.size(), 3u);
    ASSERT_EQ(plan_.owners.size(), input_.matrices.size());
  }

  StepSchedule Build(const OwnershipPlan& plan,
                     int64_t bucket_bytes = kBucketBytes,
                     int64_t stack_bytes = int64_t{1} << 30) {
    ScheduleOptions options;
    options.bucket_bytes = bucket_bytes;
    options.stack_bytes = stack_bytes;
    absl::StatusOr<StepSchedule> schedule =
        BuildStepSchedule(input_.matrices, plan, options);
    EXPECT_TRUE(schedule.ok()) << schedule.status();
    return schedule.ok() ? *std::move(schedule) : StepSchedule{};
  }

  absl::Status BuildStatus(const OwnershipPlan& plan) {
    return BuildStepSchedule(input_.matrices, plan).status();
  }

  const std::vector<MatrixSpec>& matrices() const { return input_.matrices; }

  PlanInput input_;
  OwnershipPlan plan_;
};

}  // namespace schedule_test
}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_STEP_SCHEDULE_FIXTURE_H_
