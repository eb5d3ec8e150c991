// The teacher-student regression task of the example trainer: a fixed random
// "teacher" MLP labels standard-normal inputs, and a student MLP (usually of
// the same shape) learns to reproduce it. Since the student can represent
// the teacher exactly, the loss can fall towards zero, which makes progress
// easy to read.
//
// Every input element is a pure function of (data_seed, batch index, sample
// index, feature), so rank r of R produces only its own shard of batch b, the
// shards of all ranks together are exactly the batch one process would
// produce, and a restarted trainer sees the same data for the same step.
#ifndef MUONPS_EXAMPLES_MLP_TEACHER_H_
#define MUONPS_EXAMPLES_MLP_TEACHER_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "examples/mlp/mlp.h"

namespace muonps {

// Samples [first, first + count) of a batch.
struct BatchShard {
  int64_t first = 0;
  int64_t count = 0;
};

// Rank `rank` of `world_size`'s contiguous slice of a batch of `batch_size`
// samples; the first batch_size % world_size ranks get one sample more, so
// the slices are equal (as DDP-style averaging needs, see
// Mlp::LossAndGrad) exactly when world_size divides batch_size.
// INVALID_ARGUMENT naming "world_size" (< 1), "rank" (outside
// [0, world_size)) or "batch_size" (< world_size: every rank needs a sample).
absl::StatusOr<BatchShard> ShardOfBatch(int64_t batch_size, int rank,
                                        int world_size);

struct TeacherTaskConfig {
  // The teacher's widths; the student takes the input and output widths.
  MlpShape shape;
  uint32_t teacher_seed = 1;
  // Mlp::Init scale of the teacher: sqrt(6) (He) keeps targets O(1) through
  // the ReLUs.
  float teacher_scale = 2.4494897f;
  uint32_t data_seed = 2;
};

// Inputs and targets of one shard, row-major: inputs [count x input_width],
// targets [count x output_width].
struct TeacherSamples {
  BatchShard shard;
  std::vector<float> inputs;
  std::vector<float> targets;
};

// Not thread-safe: labeling runs the teacher's Forward, which uses scratch
// buffers; give each thread its own TeacherTask. Movable, not copyable.
class TeacherTask {
 public:
  // For a shape Mlp::Create rejects, its INVALID_ARGUMENT with "shape: "
  // prepended ("shape: widths[1]: ...").
  static absl::StatusOr<TeacherTask> Create(const TeacherTaskConfig& config);

  int64_t input_width() const { return teacher_.input_width(); }
  int64_t output_width() const { return teacher_.output_width(); }
  const Mlp& teacher() const { return teacher_; }

  // Rank `rank` of `world_size`'s shard (per ShardOfBatch) of batch number
  // `batch_index` of `batch_size` samples. Inputs are i.i.d. N(0, 1);
  // targets are the teacher's outputs. Errors as ShardOfBatch, plus
  // INVALID_ARGUMENT naming "batch_index" when negative.
  absl::StatusOr<TeacherSamples> Shard(int64_t batch_index, int64_t batch_size,
                                       int rank, int world_size);

  // The whole batch: Shard(batch_index, batch_size, 0, 1).
  absl::StatusOr<TeacherSamples> Batch(int64_t batch_index,
                                       int64_t batch_size) {
    return Shard(batch_index, batch_size, 0, 1);
  }

 private:
  TeacherTask(Mlp teacher, uint32_t data_seed)
      : teacher_(std::move(teacher)), data_seed_(data_seed) {}

  Mlp teacher_;
  uint32_t data_seed_;
};

}  // namespace muonps

#endif  // MUONPS_EXAMPLES_MLP_TEACHER_H_
