#include "common/statistics.h"

#include <cmath>

#include "gtest/gtest.h"

namespace muonps {
namespace {

TEST(StatisticsTest, MedianOfOddAndEvenCountsAndOfNone) {
  EXPECT_EQ(Median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(Median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_EQ(Median({7.0}), 7.0);
  EXPECT_EQ(Median({5.0, 5.0, 1.0, 9.0}), 5.0);
  EXPECT_TRUE(std::isnan(Median({})));
}

}  // namespace
}  // namespace muonps
