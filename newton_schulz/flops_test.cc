#include "newton_schulz/flops.h"

#include "gtest/gtest.h"

namespace muonps {
namespace {

// The counts in m^3 units for 5 steps, alpha = n / m (kernels/README.md,
// "The algorithms"): dense NS5 20 alpha + 10; Gram NS with one restart
// (after step 2) 6 alpha + 14.
TEST(NsFlopsTest, MatchesDesignCountsInCubeUnits) {
  const int64_t m = 128;
  const double cube = static_cast<double>(m) * m * m;
  for (const int64_t alpha : {1, 4, 16}) {
    EXPECT_DOUBLE_EQ(Ns5DenseFlops(m, alpha * m, 5) / cube, 20.0 * alpha + 10);
    EXPECT_DOUBLE_EQ(Ns5DenseFlops(alpha * m, m, 5) / cube, 20.0 * alpha + 10);
    NewtonSchulzOptions gram;
    gram.algorithm = NsAlgorithm::kGram;
    EXPECT_DOUBLE_EQ(NsExecutedFlops(m, alpha * m, gram) / cube,
                     6.0 * alpha + 14);
    // One-triangle NS5: per step X X^T (alpha), A^2 (1), B X (2 alpha).
    EXPECT_DOUBLE_EQ(NsExecutedFlops(alpha * m, m, {}) / cube,
                     5 * (3.0 * alpha + 1));
  }
}

TEST(NsFlopsTest, GramWithoutRestartsSkipsTheRebuild) {
  const int64_t m = 64;
  const double cube = static_cast<double>(m) * m * m;
  NewtonSchulzOptions gram;
  gram.algorithm = NsAlgorithm::kGram;
  gram.gram_restarts = {};
  // G (alpha) + 5 R^2 + 4 Q updates + 4 R updates (2 each) + Q X0 (2 alpha).
  EXPECT_DOUBLE_EQ(NsExecutedFlops(m, 4 * m, gram) / cube, 3.0 * 4 + 5 + 4 + 8);
}

}  // namespace
}  // namespace muonps
