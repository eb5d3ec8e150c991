#include "kernels/muon_kernels.h"

#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace kernels {
namespace {

using ::testing::HasSubstr;

TEST(AdjustedLrTest, MatchesTorchOptimMuonForBothModes) {
  EXPECT_DOUBLE_EQ(AdjustedLr(0.02, LrAdjustment::kOriginal, 64, 32),
                   0.02 * std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(AdjustedLr(0.02, LrAdjustment::kOriginal, 32, 64), 0.02);
  EXPECT_DOUBLE_EQ(AdjustedLr(0.01, LrAdjustment::kMatchRmsAdamW, 96, 257),
                   0.01 * 0.2 * std::sqrt(257.0));
  EXPECT_DOUBLE_EQ(AdjustedLr(0.01, LrAdjustment::kMatchRmsAdamW, 257, 96),
                   0.01 * 0.2 * std::sqrt(257.0));
}

TEST(ParseTest, AcceptsKnownNamesAndNamesTheFieldOtherwise) {
  EXPECT_EQ(*ParseLrAdjustment("match_rms_adamw"),
            LrAdjustment::kMatchRmsAdamW);
  EXPECT_THAT(std::string(ParseLrAdjustment("x").status().message()),
              HasSubstr("adjust_lr_fn"));
  EXPECT_EQ(LrAdjustmentName(LrAdjustment::kOriginal), "original");
}

TEST(ValidateHyperparametersTest, RejectsEachBadFieldByName) {
  MuonHyperparameters muon;
  muon.momentum = 1.0;
  EXPECT_THAT(std::string(ValidateMuonHyperparameters(muon).message()),
              HasSubstr("momentum"));
  muon = {};
  muon.lr = -1;
  EXPECT_THAT(std::string(ValidateMuonHyperparameters(muon).message()),
              HasSubstr("lr"));
  muon = {};
  muon.weight_decay = std::numeric_limits<double>::infinity();
  EXPECT_THAT(std::string(ValidateMuonHyperparameters(muon).message()),
              HasSubstr("weight_decay"));
  AdamWHyperparameters adamw;
  adamw.beta2 = 1.0;
  EXPECT_THAT(std::string(ValidateAdamWHyperparameters(adamw).message()),
              HasSubstr("betas[1]"));
  adamw = {};
  adamw.eps = 0;
  EXPECT_THAT(std::string(ValidateAdamWHyperparameters(adamw).message()),
              HasSubstr("eps"));
  EXPECT_TRUE(ValidateAdamWHyperparameters({}).ok());
}

TEST(ValidateMuonStackTest, RejectsBadShapesNamesAndAliasing) {
  float a[6], b[6], c[6];
  MuonStack stack;
  stack.names = {"w0", "w1"};
  stack.grad = {a, 2, 1, 3};
  stack.momentum = {b, 2, 1, 3};
  stack.param = {c, 2, 1, 3};
  EXPECT_TRUE(ValidateMuonStack(stack).ok());

  MuonStack bad = stack;
  bad.param.cols = 2;
  EXPECT_THAT(std::string(ValidateMuonStack(bad).message()),
              HasSubstr("param"));
  bad = stack;
  bad.names = {"w0", "w1", "w2"};
  EXPECT_THAT(std::string(ValidateMuonStack(bad).message()),
              HasSubstr("names"));
  bad = stack;
  bad.momentum.data = c;
  EXPECT_THAT(std::string(ValidateMuonStack(bad).message()),
              HasSubstr("momentum"));
  bad = stack;
  bad.grad.rows = 0;
  EXPECT_THAT(std::string(ValidateMuonStack(bad).message()), HasSubstr("grad"));
}

TEST(MatrixNameTest, NamesExpertsOfASingleNameStack) {
  const std::vector<std::string> one = {"moe.experts"};
  EXPECT_EQ(MatrixName(one, 3), "\"moe.experts\"[expert 3]");
  const std::vector<std::string> two = {"a", "b"};
  EXPECT_EQ(MatrixName(two, 1), "\"b\"");
}

}  // namespace
}  // namespace kernels
}  // namespace muonps
