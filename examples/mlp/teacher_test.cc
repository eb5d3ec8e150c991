#include "examples/mlp/teacher.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace muonps {
namespace {

TeacherTaskConfig SmallConfig() {
  TeacherTaskConfig config;
  config.shape.widths = {12, 20, 5};
  return config;
}

TEST(ShardOfBatchTest, ShardsTileTheBatchInRankOrderDifferingByAtMostOne) {
  for (int world_size : {1, 2, 3, 4, 7}) {
    for (int64_t batch_size :
         {int64_t{7}, int64_t{12}, int64_t{64}, int64_t{67}}) {
      if (batch_size < world_size) continue;
      int64_t next = 0;
      for (int rank = 0; rank < world_size; ++rank) {
        absl::StatusOr<BatchShard> shard =
            ShardOfBatch(batch_size, rank, world_size);
        ASSERT_TRUE(shard.ok()) << shard.status();
        EXPECT_EQ(shard->first, next);
        EXPECT_GE(shard->count, batch_size / world_size);
        EXPECT_LE(shard->count, batch_size / world_size + 1);
        next += shard->count;
      }
      EXPECT_EQ(next, batch_size) << "world_size " << world_size;
    }
  }
}

TEST(ShardOfBatchTest, BadRankWorldOrBatchIsInvalidArgumentNamingIt) {
  auto message = [](int64_t batch_size, int rank, int world_size) {
    return std::string(
        ShardOfBatch(batch_size, rank, world_size).status().message());
  };
  EXPECT_NE(message(8, 0, 0).find("world_size"), std::string::npos);
  EXPECT_NE(message(8, 4, 4).find("rank"), std::string::npos);
  EXPECT_NE(message(8, -1, 4).find("rank"), std::string::npos);
  EXPECT_NE(message(3, 0, 4).find("batch_size"), std::string::npos);
}

TEST(TeacherTaskTest, ShardsAreTheRowsOfTheFullBatch) {
  absl::StatusOr<TeacherTask> task = TeacherTask::Create(SmallConfig());
  ASSERT_TRUE(task.ok()) << task.status();
  const int64_t in = task->input_width(), out = task->output_width();
  absl::StatusOr<TeacherSamples> full = task->Batch(3, 10);
  ASSERT_TRUE(full.ok()) << full.status();
  for (int rank = 0; rank < 3; ++rank) {
    absl::StatusOr<TeacherSamples> shard = task->Shard(3, 10, rank, 3);
    ASSERT_TRUE(shard.ok()) << shard.status();
    const BatchShard& s = shard->shard;
    ASSERT_EQ(shard->inputs.size(), static_cast<size_t>(s.count * in));
    ASSERT_EQ(shard->targets.size(), static_cast<size_t>(s.count * out));
    for (int64_t i = 0; i < s.count * in; ++i) {
      ASSERT_EQ(shard->inputs[i], full->inputs[s.first * in + i]) << i;
    }
    // Same rows through the same teacher; GEMM blocking may differ with
    // the batch size, so allow fp32 rounding.
    for (int64_t i = 0; i < s.count * out; ++i) {
      ASSERT_NEAR(shard->targets[i], full->targets[s.first * out + i],
                  1e-5f * (1.0f + std::abs(shard->targets[i])))
          << i;
    }
  }
}

TEST(TeacherTaskTest, SameConfigGivesBitwiseSameDataAndSeedsChangeIt) {
  absl::StatusOr<TeacherTask> a = TeacherTask::Create(SmallConfig());
  absl::StatusOr<TeacherTask> b = TeacherTask::Create(SmallConfig());
  TeacherTaskConfig other_data = SmallConfig();
  other_data.data_seed = 99;
  TeacherTaskConfig other_teacher = SmallConfig();
  other_teacher.teacher_seed = 99;
  absl::StatusOr<TeacherTask> c = TeacherTask::Create(other_data);
  absl::StatusOr<TeacherTask> d = TeacherTask::Create(other_teacher);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());

  const TeacherSamples sa = *a->Batch(5, 16);
  const TeacherSamples sb = *b->Batch(5, 16);
  EXPECT_EQ(sa.inputs, sb.inputs);
  EXPECT_EQ(sa.targets, sb.targets);
  EXPECT_NE(sa.inputs, a->Batch(6, 16)->inputs) << "batches must differ";
  EXPECT_NE(sa.inputs, c->Batch(5, 16)->inputs);
  const TeacherSamples sd = *d->Batch(5, 16);
  EXPECT_EQ(sa.inputs, sd.inputs);
  EXPECT_NE(sa.targets, sd.targets);
}

TEST(TeacherTaskTest, InputsAreStandardNormalAndTargetsOrderOne) {
  absl::StatusOr<TeacherTask> task = TeacherTask::Create(SmallConfig());
  ASSERT_TRUE(task.ok()) << task.status();
  absl::StatusOr<TeacherSamples> batch = task->Batch(0, 4000);
  ASSERT_TRUE(batch.ok()) << batch.status();
  double sum = 0.0, sum_sq = 0.0;
  for (float v : batch->inputs) {
    sum += v;
    sum_sq += static_cast<double>(v) * v;
  }
  const double n = batch->inputs.size();  // 48000 draws
  // Standard errors: mean 1/sqrt(n) ~ 0.0046, variance sqrt(2/n) ~ 0.0065.
  EXPECT_NEAR(sum / n, 0.0, 0.025);
  EXPECT_NEAR(sum_sq / n - (sum / n) * (sum / n), 1.0, 0.035);
  double target_sq = 0.0;
  for (float v : batch->targets) target_sq += static_cast<double>(v) * v;
  const double target_rms = std::sqrt(target_sq / batch->targets.size());
  EXPECT_GT(target_rms, 0.1);
  EXPECT_LT(target_rms, 10.0);
}

TEST(TeacherTaskTest, BadShapeOrBatchIndexIsInvalidArgument) {
  TeacherTaskConfig config;
  config.shape.widths = {4};
  absl::Status shape = TeacherTask::Create(config).status();
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("shape: widths"), absl::string_view::npos)
      << shape;
  absl::StatusOr<TeacherTask> task = TeacherTask::Create(SmallConfig());
  ASSERT_TRUE(task.ok()) << task.status();
  EXPECT_NE(task->Batch(-1, 8).status().message().find("batch_index"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace muonps
