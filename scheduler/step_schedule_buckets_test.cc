// BuildStepSchedule's buckets (scheduler/step_schedule.h): every matrix in
// exactly one, in reverse layer order, within the byte bound unless one
// matrix alone exceeds it, experts never split; and each item's transfers
// follow its layout, its owner in the plan and its payload.
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "scheduler/planner.h"
#include "scheduler/step_schedule.h"
#include "scheduler/step_schedule_fixture.h"

namespace muonps {
namespace scheduler {
namespace {

using schedule_test::Describe;
using schedule_test::kBucketBytes;
using schedule_test::StepScheduleTest;

// Gradient bytes of all experts of a matrix.
int64_t StackBytes(const MatrixSpec& m) { return PayloadBytes(m) * m.experts; }

TEST_F(StepScheduleTest, BucketsCoverEveryMatrixExactlyOnce) {
  const StepSchedule schedule = Build(plan_);
  std::vector<int> seen(matrices().size(), 0);
  for (const Bucket& bucket : schedule.buckets) {
    EXPECT_FALSE(bucket.matrices.empty());
    for (const int32_t m : bucket.matrices) {
      ASSERT_GE(m, 0);
      ASSERT_LT(m, static_cast<int32_t>(matrices().size()));
      ++seen[m];
    }
  }
  for (size_t m = 0; m < seen.size(); ++m) {
    EXPECT_EQ(seen[m], 1) << matrices()[m].name;
  }
}

TEST_F(StepScheduleTest, BucketsRunInReverseLayerOrder) {
  const StepSchedule schedule = Build(plan_);
  ASSERT_GE(schedule.buckets.size(), 3u);
  for (size_t k = 0; k < schedule.buckets.size(); ++k) {
    const Bucket& bucket = schedule.buckets[k];
    SCOPED_TRACE(absl::StrCat("bucket ", k));
    ASSERT_FALSE(bucket.matrices.empty());
    EXPECT_EQ(bucket.first_layer, matrices()[bucket.matrices.front()].layer);
    EXPECT_EQ(bucket.last_layer, matrices()[bucket.matrices.back()].layer);
    EXPECT_GE(bucket.first_layer, bucket.last_layer);
    for (size_t i = 1; i < bucket.matrices.size(); ++i) {
      EXPECT_GE(matrices()[bucket.matrices[i - 1]].layer,
                matrices()[bucket.matrices[i]].layer);
    }
    if (k + 1 < schedule.buckets.size()) {
      const Bucket& next = schedule.buckets[k + 1];
      EXPECT_GE(bucket.first_layer, next.first_layer);
      EXPECT_GE(bucket.last_layer, next.first_layer);
    }
  }
  EXPECT_EQ(schedule.buckets.front().first_layer, 3);
  EXPECT_EQ(schedule.buckets.back().last_layer, 0);
}

TEST_F(StepScheduleTest, BucketBytesStayWithinTheBoundUnlessOneLargeMatrix) {
  const StepSchedule schedule = Build(plan_);
  bool saw_shared_bucket = false;
  bool saw_oversized_matrix = false;
  for (size_t k = 0; k < schedule.buckets.size(); ++k) {
    const Bucket& bucket = schedule.buckets[k];
    SCOPED_TRACE(absl::StrCat("bucket ", k));
    int64_t sum = 0;
    for (const int32_t m : bucket.matrices) sum += StackBytes(matrices()[m]);
    EXPECT_EQ(bucket.bytes, sum);
    if (bucket.matrices.size() > 1) saw_shared_bucket = true;
    if (bucket.bytes > kBucketBytes) {
      ASSERT_EQ(bucket.matrices.size(), 1u);
      EXPECT_GT(StackBytes(matrices()[bucket.matrices[0]]), kBucketBytes);
      saw_oversized_matrix = true;
    }
    // A bucket closes only when the next matrix would not fit.
    if (k + 1 < schedule.buckets.size()) {
      const int32_t next = schedule.buckets[k + 1].matrices.front();
      EXPECT_GT(bucket.bytes + StackBytes(matrices()[next]), kBucketBytes);
    }
  }
  EXPECT_TRUE(saw_shared_bucket);
  EXPECT_TRUE(saw_oversized_matrix);
}

TEST_F(StepScheduleTest, MatrixNeverSplitsAcrossBucketsExpertsIncluded) {
  const StepSchedule schedule = Build(plan_);
  std::map<int32_t, size_t> bucket_of;
  for (size_t k = 0; k < schedule.buckets.size(); ++k) {
    for (const int32_t m : schedule.buckets[k].matrices) bucket_of[m] = k;
  }
  std::map<std::pair<int32_t, int32_t>, int> updates;
  for (size_t k = 0; k < schedule.buckets.size(); ++k) {
    const Bucket& bucket = schedule.buckets[k];
    for (const auto* list : {&bucket.to_owners, &bucket.from_owners}) {
      for (const Transfer& t : *list) {
        ASSERT_EQ(bucket_of.count(t.item.matrix), 1u) << Describe(t);
        EXPECT_EQ(bucket_of[t.item.matrix], k) << Describe(t);
      }
    }
    for (const Transfer& t : bucket.from_owners) {
      ++updates[{t.item.matrix, t.item.expert}];
    }
  }
  // Every expert of every matrix comes back exactly once.
  for (size_t m = 0; m < matrices().size(); ++m) {
    for (int32_t e = 0; e < matrices()[m].experts; ++e) {
      EXPECT_EQ((updates[{static_cast<int32_t>(m), e}]), 1)
          << matrices()[m].name << " expert " << e;
    }
  }
}

// Checks the transfers of every item against its layout and `plan`'s owner.
void ExpectTransfersFollowLayouts(const std::vector<MatrixSpec>& matrices,
                                  const OwnershipPlan& plan,
                                  const StepSchedule& schedule) {
  std::map<std::pair<int32_t, int32_t>, std::vector<Transfer>> to, from;
  for (const Bucket& bucket : schedule.buckets) {
    for (const Transfer& t : bucket.to_owners) {
      to[{t.item.matrix, t.item.expert}].push_back(t);
    }
    for (const Transfer& t : bucket.from_owners) {
      from[{t.item.matrix, t.item.expert}].push_back(t);
    }
  }
  for (size_t mi = 0; mi < matrices.size(); ++mi) {
    const int32_t m = static_cast<int32_t>(mi);
    const MatrixSpec& spec = matrices[mi];
    for (int32_t e = 0; e < spec.experts; ++e) {
      SCOPED_TRACE(
          absl::StrCat(spec.name, " expert ", e, " ", LayoutName(spec.layout)));
      const std::vector<Transfer>& in = to[{m, e}];
      const std::vector<Transfer>& out = from[{m, e}];
      ASSERT_EQ(out.size(), 1u);
      switch (spec.layout) {
        case Layout::kReplicated:
          EXPECT_TRUE(in.empty());
          EXPECT_EQ(TransferKindName(out[0].kind), "broadcast");
          break;
        case Layout::kUnreduced:
          ASSERT_EQ(in.size(), 1u);
          EXPECT_EQ(TransferKindName(in[0].kind), "reduce");
          EXPECT_EQ(TransferKindName(out[0].kind), "broadcast");
          break;
        case Layout::kRowSharded:
          ASSERT_EQ(in.size(), 1u);
          EXPECT_EQ(TransferKindName(in[0].kind), "gather");
          EXPECT_EQ(TransferKindName(out[0].kind), "scatter");
          break;
      }
      std::vector<Transfer> all = in;
      all.push_back(out[0]);
      for (const Transfer& t : all) {
        EXPECT_EQ(t.owner, plan.owners[mi][e]) << Describe(t);
        EXPECT_EQ(t.bytes, PayloadBytes(spec)) << Describe(t);
      }
    }
  }
}

TEST_F(StepScheduleTest, TransfersMatchLayoutOwnerAndPayload) {
  ExpectTransfersFollowLayouts(matrices(), plan_, Build(plan_));
}

TEST_F(StepScheduleTest, TransfersFollowAnyValidOwnerAssignment) {
  // Owners rotated by hand, so every worker (and experts of one stack on
  // different workers) appears whatever the planner chose.
  OwnershipPlan rotated = plan_;
  // The planner's batches belong to its owners, not to these.
  rotated.batches.clear();
  for (size_t m = 0; m < rotated.owners.size(); ++m) {
    for (size_t e = 0; e < rotated.owners[m].size(); ++e) {
      rotated.owners[m][e] = static_cast<int32_t>((m + e) % 3);
    }
  }
  ExpectTransfersFollowLayouts(matrices(), rotated, Build(rotated));
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
