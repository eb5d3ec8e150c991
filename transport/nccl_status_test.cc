// NcclStatus's codes and message form: those of common/cuda_status.h.
// Needs no GPU.
#include "transport/nccl_status.h"

#include <chrono>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace muonps {
namespace transport {
namespace nccl {
namespace {

using ::testing::StartsWith;

TEST(NcclStatusTest, SuccessIsOk) {
  EXPECT_TRUE(NcclStatus(ncclSuccess, "ncclSend", nullptr).ok());
}

TEST(NcclStatusTest, MessageNamesWhatThenTheResultName) {
  const absl::Status status =
      NcclStatus(ncclRemoteError, "ncclGroupEnd", nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()),
              StartsWith("ncclGroupEnd: ncclRemoteError: "));
}

TEST(NcclStatusTest, LostPeersAreUnavailableBadArgumentsInvalidRestInternal) {
  EXPECT_EQ(CodeFor(ncclSystemError), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeFor(ncclRemoteError), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CodeFor(ncclInvalidArgument), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CodeFor(ncclUnhandledCudaError), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeFor(ncclInternalError), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeFor(ncclInvalidUsage), absl::StatusCode::kInternal);
  EXPECT_EQ(CodeFor(ncclInProgress), absl::StatusCode::kInternal);
}

TEST(NcclStatusTest, AcceptedMeansDoneOrStillRunning) {
  EXPECT_TRUE(Accepted(ncclSuccess));
  EXPECT_TRUE(Accepted(ncclInProgress));
  EXPECT_FALSE(Accepted(ncclSystemError));
}

}  // namespace
}  // namespace nccl
}  // namespace transport
}  // namespace muonps
