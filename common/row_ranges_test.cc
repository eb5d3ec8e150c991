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

}  // namespace
}  // namespace muonps
