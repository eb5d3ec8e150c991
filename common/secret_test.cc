#include "common/secret.h"

#include <set>

#include "gtest/gtest.h"

namespace muonps {
namespace {

TEST(RandomHexTest, GivesTwoLowercaseHexDigitsPerByteAndNeverRepeats) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string s = RandomHex(32);
    ASSERT_EQ(s.size(), 64u);
    EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos);
    EXPECT_TRUE(seen.insert(s).second);
  }
  EXPECT_EQ(RandomHex(0), "");
}

TEST(SecretsEqualTest, ComparesWholeSecrets) {
  EXPECT_TRUE(SecretsEqual("abcdef", "abcdef"));
  EXPECT_TRUE(SecretsEqual("", ""));
  EXPECT_FALSE(SecretsEqual("abcdef", "abcdeg"));
  EXPECT_FALSE(SecretsEqual("bbcdef", "abcdef"));
  EXPECT_FALSE(SecretsEqual("abcdef", "abcde"));
}

TEST(IsLoopbackHostTest, KnowsLoopbackAddresses) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.3.2.1"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_TRUE(IsLoopbackHost("[::1]"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("::"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("example.com"));
}

}  // namespace
}  // namespace muonps
