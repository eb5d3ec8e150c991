#include "proto/grpc_status.h"

#include "gtest/gtest.h"

namespace muonps {
namespace {

TEST(GrpcStatusTest, CodesAndMessagesSurviveTheRoundTrip) {
  const absl::Status original =
      absl::InvalidArgumentError("job.matrices[3].rows: 0 is not in [1, 8]");
  const grpc::Status wire = ToGrpc(original);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(wire.error_message(), original.message());
  EXPECT_EQ(FromGrpc(wire, ""), original);
  EXPECT_EQ(FromGrpc(wire, "CreateJob").message(),
            "CreateJob: job.matrices[3].rows: 0 is not in [1, 8]");
  EXPECT_TRUE(ToGrpc(absl::OkStatus()).ok());
  EXPECT_TRUE(FromGrpc(grpc::Status::OK, "x").ok());
}

TEST(GrpcStatusTest, DeadlineIsThatFarAhead) {
  const auto now = std::chrono::system_clock::now();
  const auto deadline = DeadlineIn(absl::Seconds(5));
  EXPECT_GE(deadline - now, std::chrono::milliseconds(4900));
  EXPECT_LE(deadline - now, std::chrono::milliseconds(6000));
}

}  // namespace
}  // namespace muonps
