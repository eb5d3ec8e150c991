#include "transport/group_nesting.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace muonps {
namespace transport {
namespace {

TEST(GroupNestingTest, StartsOutsideAnyGroup) {
  GroupNesting group;
  EXPECT_FALSE(group.grouped());
}

TEST(GroupNestingTest, ThreeDeepRunsOnlyAtTheOutermostEnd) {
  GroupNesting group;
  group.Start();
  group.Start();
  group.Start();
  EXPECT_TRUE(group.grouped());

  absl::StatusOr<bool> ended = group.End();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_FALSE(*ended);
  EXPECT_TRUE(group.grouped());

  ended = group.End();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_FALSE(*ended);
  EXPECT_TRUE(group.grouped());

  ended = group.End();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(*ended);
  EXPECT_FALSE(group.grouped());
}

TEST(GroupNestingTest, EndWithoutStartIsFailedPrecondition) {
  GroupNesting group;
  const absl::StatusOr<bool> ended = group.End();
  ASSERT_FALSE(ended.ok());
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ended.status().message(), "GroupEnd without a matching GroupStart");
  EXPECT_FALSE(group.grouped());
}

TEST(GroupNestingTest, EndPastTheOutermostIsFailedPrecondition) {
  GroupNesting group;
  group.Start();
  ASSERT_TRUE(group.End().ok());
  EXPECT_EQ(group.End().status().code(), absl::StatusCode::kFailedPrecondition);
  // Still usable afterwards: the depth stayed at 0, not -1.
  group.Start();
  const absl::StatusOr<bool> ended = group.End();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(*ended);
}

TEST(GroupNestingTest, ResetClosesEveryGroup) {
  GroupNesting group;
  group.Start();
  group.Start();
  group.Reset();
  EXPECT_FALSE(group.grouped());
  EXPECT_EQ(group.End().status().code(), absl::StatusCode::kFailedPrecondition);
  // A fresh group after Reset runs at its own End.
  group.Start();
  const absl::StatusOr<bool> ended = group.End();
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_TRUE(*ended);
}

}  // namespace
}  // namespace transport
}  // namespace muonps
