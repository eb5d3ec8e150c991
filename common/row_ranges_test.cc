#include "common/row_ranges.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace muonps {
namespace {

using Range = std::pair<int64_t, int64_t>;

std::vector<Range> Split(int64_t rows, int count) {
  std::vector<Range> out;
  for (int r = 0; r < count; ++r)
    out.push_back(TrainerRowRange(rows, r, count));
  return out;
}

TEST(TrainerRowRangeTest, EvenSplit) {
  EXPECT_EQ(Split(8, 4), (std::vector<Range>{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(Split(5, 1), (std::vector<Range>{{0, 5}}));
}

// torch.chunk(x, n) and DTensor's Shard(0): ceil(rows / n) rows each, the
// remainder (possibly nothing) on the last ranks.
TEST(TrainerRowRangeTest, UnevenSplitFollowsTorchChunk) {
  EXPECT_EQ(Split(10, 4),
            (std::vector<Range>{{0, 3}, {3, 6}, {6, 9}, {9, 10}}));
  EXPECT_EQ(Split(7, 2), (std::vector<Range>{{0, 4}, {4, 7}}));
  EXPECT_EQ(Split(6, 4), (std::vector<Range>{{0, 2}, {2, 4}, {4, 6}, {6, 6}}));
  EXPECT_EQ(Split(3, 4), (std::vector<Range>{{0, 1}, {1, 2}, {2, 3}, {3, 3}}));
}

TEST(TrainerRowRangeTest, RangesTileTheRows) {
  for (int64_t rows = 1; rows <= 40; ++rows) {
    for (int count = 1; count <= 9; ++count) {
      int64_t next = 0;
      for (const Range& r : Split(rows, count)) {
        EXPECT_EQ(r.first, next) << rows << " rows over " << count;
        EXPECT_LE(r.first, r.second);
        next = r.second;
      }
      EXPECT_EQ(next, rows);
    }
  }
}

TEST(TrainerRowRangeTest, LargeSizesDoNotOverflow) {
  const int64_t rows = int64_t{1} << 40;
  EXPECT_EQ(TrainerRowRange(rows, 7, 8), (Range{rows / 8 * 7, rows}));
}

// Each expert's rows split as one matrix's, the shard's buffer expert-major.
TEST(ShardPartOfExpertTest, ExpertRowsSplitPerExpert) {
  // 3 experts of 10 rows over 4 shards: shard 1 holds rows [3, 6) of each.
  for (int64_t e = 0; e < 3; ++e) {
    const ExpertPart p = ShardPartOfExpert(10, 3, false, e, 1, 4);
    EXPECT_EQ(p.row_begin, 3);
    EXPECT_EQ(p.row_end, 6);
    EXPECT_EQ(p.first_row, e * 3);
  }
  EXPECT_EQ(ShardRows(10, 3, false, 1, 4), 9);
  EXPECT_EQ(ShardRows(10, 3, false, 3, 4), 3);
}

// Sharded on its experts (torch.chunk of dimension 0): 5 experts over 2
// shards, 3 + 2, each held whole by one shard.
TEST(ShardPartOfExpertTest, WholeExpertsSplitAsTorchChunk) {
  for (int64_t e = 0; e < 5; ++e) {
    const int holder = e < 3 ? 0 : 1;
    for (int shard = 0; shard < 2; ++shard) {
      const ExpertPart p = ShardPartOfExpert(7, 5, true, e, shard, 2);
      if (shard == holder) {
        EXPECT_EQ(p.row_begin, 0) << e;
        EXPECT_EQ(p.row_end, 7) << e;
        EXPECT_EQ(p.first_row, (e - 3 * holder) * 7) << e;
      } else {
        EXPECT_EQ(p.rows(), 0) << e << " on shard " << shard;
      }
    }
  }
  EXPECT_EQ(ShardRows(7, 5, true, 0, 2), 21);
  EXPECT_EQ(ShardRows(7, 5, true, 1, 2), 14);
  // 3 experts over 4 shards: the last holds none.
  EXPECT_EQ(ShardRows(7, 3, true, 3, 4), 0);
}

// Every expert's rows are held exactly once, and each shard's parts tile
// its buffer, in both splits and within replica groups.
TEST(ShardPartOfExpertTest, PartsTileEachExpertAndEachBuffer) {
  for (const bool whole : {false, true}) {
    for (int64_t experts = 1; experts <= 6; ++experts) {
      for (int count = 1; count <= 6; ++count) {
        for (const int replicas : {1, 2}) {
          if (count % replicas != 0) continue;
          const int shards = count / replicas;
          for (int rank = 0; rank < count; ++rank) {
            int64_t filled = 0;
            for (int64_t e = 0; e < experts; ++e) {
              const ExpertPart p = ReplicaPartOfExpert(5, experts, whole, e,
                                                       rank, count, replicas);
              if (p.rows() == 0) continue;
              EXPECT_EQ(p.first_row, filled);
              filled += p.rows();
            }
            EXPECT_EQ(filled,
                      ShardRows(5, experts, whole, rank % shards, shards));
          }
          for (int64_t e = 0; e < experts; ++e) {
            std::vector<int> held(5, 0);
            for (int shard = 0; shard < shards; ++shard) {
              const ExpertPart p =
                  ShardPartOfExpert(5, experts, whole, e, shard, shards);
              for (int64_t r = p.row_begin; r < p.row_end; ++r) ++held[r];
            }
            EXPECT_EQ(held, std::vector<int>(5, 1)) << whole << " " << e;
          }
        }
      }
    }
  }
}

}  // namespace
TEST(ShardHoldingExpertTest, TheShardWhoseRangeHoldsTheExpert) {
  for (const int shards : {1, 2, 3, 4, 7, 300}) {
    for (const int64_t experts : {1, 5, 8, 256}) {
      for (int64_t e = 0; e < experts; ++e) {
        const int s = ShardHoldingExpert(experts, e, shards);
        ASSERT_GE(s, 0) << experts << " " << e << " " << shards;
        const auto [begin, end] = TrainerRowRange(experts, s, shards);
        EXPECT_TRUE(e >= begin && e < end) << experts << " " << e;
        EXPECT_EQ(ShardPartOfExpert(3, experts, true, e, s, shards).rows(), 3);
      }
    }
  }
  EXPECT_EQ(ShardHoldingExpert(4, 4, 2), -1);
  EXPECT_EQ(ShardHoldingExpert(4, -1, 2), -1);
  EXPECT_EQ(ShardHoldingExpert(4, 0, 0), -1);
}

}  // namespace muonps
