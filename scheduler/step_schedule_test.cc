#include "scheduler/step_schedule.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/planner.h"

namespace muonps {
namespace scheduler {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

MatrixSpec Matrix(std::string name, int64_t rows, int64_t cols, DType dtype,
                  Layout layout, int32_t layer, int64_t experts = 1) {
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

// Gradient bytes of all experts of a matrix.
int64_t StackBytes(const MatrixSpec& m) { return PayloadBytes(m) * m.experts; }

// A small model in registration order (not layer order), every layout, two
// expert stacks, and two matrices larger than kBucketBytes.
std::vector<MatrixSpec> ModelMatrices() {
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

std::string Describe(const Transfer& t) {
  return absl::StrCat(TransferKindName(t.kind), " m", t.item.matrix, " e",
                      t.item.expert, " owner ", t.owner, " bytes ", t.bytes);
}

std::vector<std::string> Describe(const std::vector<Transfer>& transfers) {
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

TEST_F(StepScheduleTest, RefusesANonPositiveStackBound) {
  ScheduleOptions options;
  options.stack_bytes = 0;
  absl::StatusOr<StepSchedule> schedule =
      BuildStepSchedule(matrices(), plan_, options);
  ASSERT_FALSE(schedule.ok());
  EXPECT_THAT(std::string(schedule.status().message()),
              HasSubstr("stack_bytes"));
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
