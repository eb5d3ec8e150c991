// Which NCCL ids a rank other than 0 starts on: not one rank 0 is about to
// give up. Needs no GPU.
#include "server/worker/nccl_bootstrap.h"

#include "gtest/gtest.h"

namespace muonps {
namespace worker {
namespace {

TEST(IdStillJoinableTest, AnIdWithLittleOfRankZerosWaitLeftIsPassedOver) {
  const absl::Duration timeout = absl::Seconds(10);
  EXPECT_TRUE(IdStillJoinable(absl::ZeroDuration(), timeout));  // not known
  EXPECT_TRUE(IdStillJoinable(absl::Seconds(7), timeout));
  EXPECT_FALSE(IdStillJoinable(absl::Seconds(8), timeout));
  // The case it is for: the peer arrives as rank 0's wait ends.
  EXPECT_FALSE(IdStillJoinable(absl::Milliseconds(9990), timeout));
  EXPECT_FALSE(IdStillJoinable(absl::Seconds(30), timeout));
  // Short timeouts keep a second of margin.
  EXPECT_TRUE(IdStillJoinable(absl::Milliseconds(900), absl::Seconds(2)));
  EXPECT_FALSE(IdStillJoinable(absl::Milliseconds(1100), absl::Seconds(2)));
}

}  // namespace
}  // namespace worker
}  // namespace muonps
