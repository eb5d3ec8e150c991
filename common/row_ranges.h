// How row_sharded matrices split among trainer ranks, the rule of
// torch.chunk and of a DTensor sharded on dimension 0 (FSDP2's fully_shard,
// Shard(0)): with chunk = ceil(rows / n), rank r of n holds rows
// [min(r * chunk, rows), min((r + 1) * chunk, rows)), so the last ranks may
// hold fewer rows, or none. A stack of experts splits either each expert's
// rows by that rule (a 3-D DTensor's Shard(1)), or, sharded on its experts
// (Shard(0): FSDP2's default for a 3-D parameter), the experts by that rule,
// each rank holding whole experts. The client library, the workers and any
// trainer agree on this one rule, so a model sharded by PyTorch lends its
// own shards as they are. Pure functions.
#ifndef MUONPS_COMMON_ROW_RANGES_H_
#define MUONPS_COMMON_ROW_RANGES_H_

#include <algorithm>
#include <cstdint>
#include <tuple>
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

// What one trainer shard holds of one expert of a row_sharded stack:
// rows [row_begin, row_end) of expert `expert`, starting at row `first_row`
// of the shard's lent buffer (rows of `cols` elements each, expert-major).
struct ExpertPart {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t first_row = 0;
  int64_t rows() const { return row_end - row_begin; }
};

// The part of expert `expert` (of `experts`, each `rows` rows) that shard
// `shard` of `shards` holds: its TrainerRowRange of the expert's rows, or,
// with `shard_experts`, every row of the expert when the shard holds it
// (TrainerRowRange of the experts) and nothing otherwise.
inline ExpertPart ShardPartOfExpert(int64_t rows, int64_t experts,
                                    bool shard_experts, int64_t expert,
                                    int shard, int shards) {
  ExpertPart out;
  if (!shard_experts) {
    std::tie(out.row_begin, out.row_end) = TrainerRowRange(rows, shard, shards);
    out.first_row = expert * out.rows();
    return out;
  }
  const auto [begin, end] = TrainerRowRange(experts, shard, shards);
  if (expert >= begin && expert < end) {
    out.row_end = rows;
    out.first_row = (expert - begin) * rows;
  }
  return out;
}

// The shard of `shards` whose TrainerRowRange of the `experts` experts
// holds expert `expert` whole (a stack sharded on its experts), or -1 for
// an expert past every shard's range.
inline int ShardHoldingExpert(int64_t experts, int64_t expert, int shards) {
  if (shards < 1 || expert < 0 || expert >= experts) return -1;
  const int64_t chunk = (experts + shards - 1) / shards;
  const int64_t shard = expert / chunk;
  return shard < shards ? static_cast<int>(shard) : -1;
}

// The rows (of `cols` elements) shard `shard` of `shards` lends of a
// row_sharded stack: its rows of every expert, or its whole experts.
inline int64_t ShardRows(int64_t rows, int64_t experts, bool shard_experts,
                         int shard, int shards) {
  const auto [begin, end] =
      TrainerRowRange(shard_experts ? experts : rows, shard, shards);
  return (end - begin) * (shard_experts ? rows : experts);
}

// ShardPartOfExpert for trainer `rank` of `count` in `replicas` replica
// groups (as ReplicaRowRange).
inline ExpertPart ReplicaPartOfExpert(int64_t rows, int64_t experts,
                                      bool shard_experts, int64_t expert,
                                      int rank, int count, int replicas) {
  const int shards = replicas > 1 ? count / replicas : count;
  return ShardPartOfExpert(rows, experts, shard_experts, expert, rank % shards,
                           shards);
}

}  // namespace muonps

#endif  // MUONPS_COMMON_ROW_RANGES_H_
