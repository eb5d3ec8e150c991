// How row_sharded matrices split among trainer ranks, the rule of
// torch.chunk and of a DTensor sharded on dimension 0 (FSDP2's fully_shard,
// Shard(0)): with chunk = ceil(rows / n), rank r of n holds rows
// [min(r * chunk, rows), min((r + 1) * chunk, rows)), so the last ranks may
// hold fewer rows, or none. The client library, the workers and any trainer
// agree on this one rule, so a model sharded by PyTorch lends its own shards
// as they are. Pure functions.
#ifndef MUONPS_COMMON_ROW_RANGES_H_
#define MUONPS_COMMON_ROW_RANGES_H_

#include <algorithm>
#include <cstdint>
#include <utility>

namespace muonps {

inline std::pair<int64_t, int64_t> TrainerRowRange(int64_t rows, int rank,
                                                   int count) {
  const int64_t chunk = (rows + count - 1) / count;
  const int64_t begin = std::min(rows, chunk * rank);
  return {begin, std::min(rows, begin + chunk)};
}

// The rows of trainer `rank` of `count` when the trainers form `replicas`
// replica groups (HSDP: JobSpec.replicas; 0 or 1: none) of count / replicas
// ranks each, ranks r*S .. r*S+S-1: a replica group splits the rows among
// its S ranks, the rank holding shard rank % S. `count` must be a multiple
// of `replicas`.
inline std::pair<int64_t, int64_t> ReplicaRowRange(int64_t rows, int rank,
                                                   int count, int replicas) {
  const int shards = replicas > 1 ? count / replicas : count;
  return TrainerRowRange(rows, rank % shards, shards);
}

}  // namespace muonps

#endif  // MUONPS_COMMON_ROW_RANGES_H_
