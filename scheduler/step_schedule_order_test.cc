// The order of a StepSchedule's phases (scheduler/step_schedule.h): each
// owner stack computed once its gradients are in and before its updates go
// out, single-item stacks sending each bucket back before the next, and
// one issue order that every worker computes alike.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
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
using schedule_test::kMiB;
using schedule_test::StepScheduleTest;

TEST_F(StepScheduleTest, OrderComputesStacksOnceTheirGradientsAreIn) {
  for (const int64_t bucket_bound :
       {kBucketBytes, int64_t{1}, int64_t{1} << 40}) {
    for (const int64_t stack_bound : {int64_t{1}, 2 * kMiB, int64_t{1} << 40}) {
      SCOPED_TRACE(absl::StrCat("bucket_bytes ", bucket_bound, " stack_bytes ",
                                stack_bound));
      const StepSchedule schedule = Build(plan_, bucket_bound, stack_bound);
      const int32_t buckets = static_cast<int32_t>(schedule.buckets.size());
      ASSERT_GT(buckets, 0);
      // Every item is in exactly one stack of its owner and shape, within
      // the byte bound (or alone).
      std::map<std::pair<int32_t, int32_t>, int32_t> stack_of;
      for (size_t k = 0; k < schedule.stacks.size(); ++k) {
        const OwnerStack& st = schedule.stacks[k];
        ASSERT_FALSE(st.items.empty());
        EXPECT_TRUE(st.items.size() == 1 ||
                    static_cast<int64_t>(st.items.size()) * 4 * st.rows *
                            st.cols <=
                        stack_bound);
        for (const ItemRef& item : st.items) {
          const MatrixSpec& spec = matrices()[item.matrix];
          EXPECT_EQ(plan_.owners[item.matrix][item.expert], st.owner);
          EXPECT_EQ(spec.rows, st.rows);
          EXPECT_EQ(spec.cols, st.cols);
          EXPECT_TRUE(stack_of
                          .emplace(std::make_pair(item.matrix, item.expert),
                                   static_cast<int32_t>(k))
                          .second);
        }
      }
      int64_t items = 0;
      for (const MatrixSpec& m : matrices()) items += m.experts;
      EXPECT_EQ(static_cast<int64_t>(stack_of.size()), items);
      // Position of each phase; every one appears exactly once.
      std::map<std::pair<int, int32_t>, size_t> at;
      for (size_t i = 0; i < schedule.order.size(); ++i) {
        const Phase& p = schedule.order[i];
        EXPECT_TRUE(
            at.emplace(std::make_pair(static_cast<int>(p.kind), p.index), i)
                .second);
      }
      ASSERT_EQ(at.size(), 2 * buckets + schedule.stacks.size());
      auto pos = [&](PhaseKind kind, int32_t index) {
        return at.at({static_cast<int>(kind), index});
      };
      std::map<int32_t, int32_t> bucket_of_matrix;
      for (int32_t k = 0; k < buckets; ++k) {
        if (k > 0) {  // gradients in arrival order (updates as ready)
          EXPECT_LT(pos(PhaseKind::kToOwners, k - 1),
                    pos(PhaseKind::kToOwners, k));
        }
        for (const int32_t m : schedule.buckets[k].matrices) {
          bucket_of_matrix[m] = k;
        }
      }
      for (size_t k = 0; k < schedule.stacks.size(); ++k) {
        const OwnerStack& st = schedule.stacks[k];
        const size_t compute = pos(PhaseKind::kCompute, k);
        for (const ItemRef& item : st.items) {
          const int32_t b = bucket_of_matrix[item.matrix];
          EXPECT_LE(b, st.ready_bucket);
          // Gradients in before the compute; updates out after it.
          EXPECT_LT(pos(PhaseKind::kToOwners, b), compute);
          EXPECT_GT(pos(PhaseKind::kFromOwners, b), compute);
        }
        // Computed right after the gradients that complete it arrive.
        EXPECT_LT(pos(PhaseKind::kToOwners, st.ready_bucket), compute);
        if (st.ready_bucket + 1 < buckets) {
          EXPECT_GT(pos(PhaseKind::kToOwners, st.ready_bucket + 1), compute);
        }
      }
      std::vector<Transfer> flattened;
      for (const Phase& phase : schedule.order) {
        if (phase.kind == PhaseKind::kCompute) continue;
        const Bucket& bucket = schedule.buckets[phase.index];
        const auto& list = phase.kind == PhaseKind::kToOwners
                               ? bucket.to_owners
                               : bucket.from_owners;
        flattened.insert(flattened.end(), list.begin(), list.end());
      }
      EXPECT_EQ(Describe(IssueOrder(schedule)), Describe(flattened));
    }
  }
  // One matrix per bucket at a 1-byte bound; all in one at 1 TiB.
  EXPECT_EQ(Build(plan_, 1).buckets.size(), matrices().size());
  EXPECT_EQ(Build(plan_, int64_t{1} << 40).buckets.size(), 1u);
}

TEST_F(StepScheduleTest, SingleItemStacksSendEachBucketBackBeforeTheNext) {
  // Every stack completes with its own bucket: to(k), its stacks, from(k).
  const StepSchedule schedule = Build(plan_, 1, 1);
  std::vector<std::string> kinds;
  for (const Phase& p : schedule.order) {
    if (p.kind == PhaseKind::kCompute) continue;
    kinds.push_back(absl::StrCat(
        p.kind == PhaseKind::kToOwners ? "to " : "from ", p.index));
  }
  std::vector<std::string> want;
  for (size_t k = 0; k < schedule.buckets.size(); ++k) {
    want.push_back(absl::StrCat("to ", k));
    want.push_back(absl::StrCat("from ", k));
  }
  EXPECT_EQ(kinds, want);
}

// Eight rows x cols matrices of `layout` on layers 0..7, all owned by
// worker 0 of `workers`, one bucket each.
StepSchedule EightOfOneShape(int workers, int64_t rows = 4096,
                             int64_t cols = 4096,
                             Layout layout = Layout::kReplicated) {
  std::vector<MatrixSpec> matrices;
  OwnershipPlan plan;
  for (int32_t m = 0; m < 8; ++m) {
    matrices.push_back(schedule_test::Matrix(absl::StrCat("m", m), rows, cols,
                                             DType::kFloat32, layout, m));
    plan.matrix_names.push_back(matrices.back().name);
    plan.owners.push_back({0});
  }
  for (int w = 0; w < workers; ++w) {
    plan.worker_ids.push_back(absl::StrCat("w", w));
  }
  absl::StatusOr<StepSchedule> schedule =
      BuildStepSchedule(matrices, plan, {.bucket_bytes = 1});
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  return schedule.ok() ? *std::move(schedule) : StepSchedule();
}

TEST_F(StepScheduleTest, TheLastStackOfAShapeTapersWhereUpdatesMove) {
  // Two workers: the stack of eight 4096 x 4096 (64 MiB of fp32 each)
  // tapers into 4, 2, 1 and 1 items (in arrival order, layer 7 first), each
  // computed once its last gradient is in, and the updates of each piece
  // go back before the next computes: after the last Newton-Schulz call
  // only one item's updates are left.
  const StepSchedule schedule = EightOfOneShape(2);
  ASSERT_EQ(schedule.stacks.size(), 4u);
  std::vector<std::string> order;
  for (const Phase& p : schedule.order) {
    if (p.kind == PhaseKind::kCompute) {
      std::string items;
      for (const ItemRef& item : schedule.stacks[p.index].items) {
        absl::StrAppend(&items, items.empty() ? "" : ",", "m", item.matrix);
      }
      order.push_back(absl::StrCat("compute ", items));
    } else if (p.kind == PhaseKind::kFromOwners) {
      order.push_back(absl::StrCat("from ", p.index));
    }
  }
  EXPECT_EQ(order, (std::vector<std::string>{
                       "compute m7,m6,m5,m4", "from 0", "from 1", "from 2",
                       "from 3", "compute m3,m2", "from 4", "from 5",
                       "compute m1", "from 6", "compute m0", "from 7"}));
  // One worker moves no updates: one stack of eight, as the batch runs.
  const StepSchedule alone = EightOfOneShape(1);
  ASSERT_EQ(alone.stacks.size(), 1u);
  EXPECT_EQ(alone.stacks[0].items.size(), 8u);
  // Eight 512 x 4096 (8 MiB each): halves down to 16 MiB, [4], [2], [2].
  const StepSchedule small = EightOfOneShape(2, 512, 4096);
  ASSERT_EQ(small.stacks.size(), 3u);
  EXPECT_EQ(small.stacks[0].items.size(), 4u);
  EXPECT_EQ(small.stacks[1].items.size(), 2u);
  EXPECT_EQ(small.stacks[2].items.size(), 2u);
}

TEST_F(StepScheduleTest, EachOwnersLastStackGoesBackByCollective) {
  for (const int64_t bucket_bound : {kBucketBytes, int64_t{1}}) {
    SCOPED_TRACE(absl::StrCat("bucket_bytes ", bucket_bound));
    const StepSchedule schedule = Build(plan_, bucket_bound);
    // The stack each owner computes last, in the order.
    std::map<int32_t, int32_t> last;
    for (const Phase& p : schedule.order) {
      if (p.kind == PhaseKind::kCompute) {
        last[schedule.stacks[p.index].owner] = p.index;
      }
    }
    ASSERT_GT(last.size(), 1u);
    std::map<int32_t, int64_t> marked;  // by owner
    int64_t updates = 0;
    for (const Bucket& bucket : schedule.buckets) {
      for (const Transfer& x : bucket.from_owners) {
        ++updates;
        const ItemRefs& items = schedule.stacks[last.at(x.owner)].items;
        const bool in_last =
            std::any_of(items.begin(), items.end(), [&](const ItemRef& i) {
              return i.matrix == x.item.matrix && i.expert == x.item.expert;
            });
        EXPECT_EQ(x.by_collective, in_last)
            << "m" << x.item.matrix << " owner " << x.owner;
        if (x.by_collective) ++marked[x.owner];
      }
    }
    // Every owner's last stack, and nothing else: a tail, not the step.
    EXPECT_EQ(marked.size(), last.size());
    for (const auto& [owner, count] : marked) {
      EXPECT_EQ(count, static_cast<int64_t>(
                           schedule.stacks[last.at(owner)].items.size()));
    }
    EXPECT_LT(static_cast<int64_t>(last.size()) * 2, updates);
  }
  // Two workers: one peer, whose copies are the faster; nothing is marked.
  const StepSchedule two = EightOfOneShape(2);
  for (const Bucket& bucket : two.buckets) {
    for (const Transfer& x : bucket.from_owners) EXPECT_FALSE(x.by_collective);
  }
}

TEST_F(StepScheduleTest, StacksWhoseGradientsMoveCloseAtAQuarterOfTheBound) {
  // Eight 4096 x 4096 (64 MiB each) on one worker, where nothing tapers:
  // replicated, one stack; unreduced, whose gradients are reduced onto the
  // owner, stacks of 256 MiB.
  const StepSchedule unreduced =
      EightOfOneShape(1, 4096, 4096, Layout::kUnreduced);
  ASSERT_EQ(unreduced.stacks.size(), 2u);
  EXPECT_EQ(unreduced.stacks[0].items.size(), 4u);
  EXPECT_EQ(EightOfOneShape(1).stacks.size(), 1u);
}

TEST_F(StepScheduleTest, EveryWorkerComputesTheSameIssueOrder) {
  const std::vector<Transfer> first = IssueOrder(Build(plan_));
  const OwnershipPlan copy = plan_;
  const std::vector<Transfer> second = IssueOrder(Build(plan_));
  const std::vector<Transfer> from_copy = IssueOrder(Build(copy));
  ASSERT_FALSE(first.empty());
  // Kind, item, owner and bytes, in sequence.
  EXPECT_EQ(Describe(second), Describe(first));
  EXPECT_EQ(Describe(from_copy), Describe(first));
  // Every item's update is issued exactly once per step.
  int64_t items = 0;
  for (const MatrixSpec& m : matrices()) items += m.experts;
  int64_t updates = 0;
  for (const Transfer& t : first) {
    if (t.kind == TransferKind::kBroadcastFromOwner ||
        t.kind == TransferKind::kScatterFromOwner) {
      ++updates;
    }
  }
  EXPECT_EQ(updates, items);
}

}  // namespace
}  // namespace scheduler
}  // namespace muonps
