// NsAlgorithm's names and ValidateNewtonSchulzOptions's refusals, each
// naming its field.
#include "newton_schulz/options.h"

#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace {

using ::testing::HasSubstr;

TEST(NsAlgorithmTest, ParsesKnownNamesAndNamesTheFieldOtherwise) {
  EXPECT_EQ(*ParseNsAlgorithm("gram"), NsAlgorithm::kGram);
  EXPECT_EQ(*ParseNsAlgorithm("ns5"), NsAlgorithm::kNs5);
  EXPECT_THAT(std::string(ParseNsAlgorithm("svd").status().message()),
              HasSubstr("ns_algorithm"));
  EXPECT_EQ(NsAlgorithmName(NsAlgorithm::kGram), "gram");
  EXPECT_EQ(NsAlgorithmName(NsAlgorithm::kNs5), "ns5");
}

struct BadNsOptions {
  const char* field;
  NewtonSchulzOptions options;
};

TEST(ValidateNewtonSchulzOptionsTest, RejectsEachBadFieldByName) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<BadNsOptions> cases;
  cases.push_back({"ns_steps", {}});
  cases.back().options.steps = 0;
  cases.push_back({"ns_steps", {}});
  cases.back().options.steps = 101;
  cases.push_back({"eps", {}});
  cases.back().options.eps = 0;
  cases.push_back({"eps", {}});
  cases.back().options.eps = nan;
  cases.push_back({"ns_coefficients", {}});
  cases.back().options.coefficients.b = nan;
  cases.push_back({"gram_restarts[1]", {}});
  cases.back().options.gram_restarts = {2, -1};
  cases.push_back({"gram_restarts[0]", {}});
  cases.back().options.gram_restarts = {0};
  for (const BadNsOptions& c : cases) {
    const absl::Status status = ValidateNewtonSchulzOptions(c.options);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.field));
  }
  EXPECT_TRUE(ValidateNewtonSchulzOptions({}).ok());
}

}  // namespace
}  // namespace muonps
