#include "examples/mlp/teacher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "examples/mlp/counter_random.h"

namespace muonps {

absl::StatusOr<BatchShard> ShardOfBatch(int64_t batch_size, int rank,
                                        int world_size) {
  if (world_size < 1) {
    return InvalidField("world_size",
                        absl::StrCat(world_size, " must be >= 1"));
  }
  if (rank < 0 || rank >= world_size) {
    return InvalidField(
        "rank", absl::StrCat(rank, " is outside [0, ", world_size, ")"));
  }
  if (batch_size < world_size) {
    return InvalidField(
        "batch_size", absl::StrCat(batch_size, " is less than world_size ",
                                   world_size, ": a rank would get no sample"));
  }
  const int64_t base = batch_size / world_size;
  const int64_t extra = batch_size % world_size;
  BatchShard shard;
  shard.count = base + (rank < extra ? 1 : 0);
  shard.first = rank * base + std::min<int64_t>(rank, extra);
  return shard;
}

absl::StatusOr<TeacherTask> TeacherTask::Create(
    const TeacherTaskConfig& config) {
  absl::StatusOr<Mlp> teacher = Mlp::Create(config.shape);
  if (!teacher.ok()) return Annotate(teacher.status(), "shape");
  teacher->Init(config.teacher_seed, config.teacher_scale);
  return TeacherTask(*std::move(teacher), config.data_seed);
}

absl::StatusOr<TeacherSamples> TeacherTask::Shard(int64_t batch_index,
                                                  int64_t batch_size, int rank,
                                                  int world_size) {
  if (batch_index < 0) {
    return InvalidField("batch_index",
                        absl::StrCat(batch_index, " must be >= 0"));
  }
  TeacherSamples samples;
  MUONPS_ASSIGN_OR_RETURN(samples.shard,
                          ShardOfBatch(batch_size, rank, world_size));
  const int64_t in = input_width();
  samples.inputs.resize(samples.shard.count * in);
  for (int64_t i = 0; i < samples.shard.count; ++i) {
    const int64_t sample = samples.shard.first + i;
    for (int64_t j = 0; j < in; ++j) {
      samples.inputs[i * in + j] = mlp_random::Normal(
          data_seed_, static_cast<uint64_t>(batch_index), sample * in + j);
    }
  }
  samples.targets.resize(samples.shard.count * output_width());
  MUONPS_RETURN_IF_ERROR(teacher_.Forward(
      samples.inputs.data(), samples.shard.count, samples.targets.data()));
  return samples;
}

}  // namespace muonps
