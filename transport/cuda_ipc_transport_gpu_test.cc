// CudaIpcTransport's group rules, as on the TCP and NCCL transports: a wait
// inside a group is refused and leaves the transport usable; a GroupEnd
// with no group open breaks it. Two ranks as threads of one process on GPU
// 0 (their transfers need two processes: CUDA IPC does not open a
// process's own memory; the worker's GPU tests move data). Needs a GPU:
// tagged manual, run on the GPU machine by deploy/device.
#include <memory>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "transport/cuda_ipc_transport.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace transport {
namespace {

using ::testing::HasSubstr;

std::vector<std::unique_ptr<CudaIpcTransport>> TwoRanks() {
  absl::StatusOr<std::vector<std::unique_ptr<TcpTransport>>> control =
      ConnectLoopbackWorld(2, /*session=*/7, LoopbackOptions());
  EXPECT_TRUE(control.ok()) << control.status();
  std::vector<std::unique_ptr<CudaIpcTransport>> ranks;
  if (!control.ok()) return ranks;
  for (std::unique_ptr<TcpTransport>& tcp : *control) {
    absl::StatusOr<std::unique_ptr<CudaIpcTransport>> rank =
        CudaIpcTransport::Create(0, std::move(tcp));
    EXPECT_TRUE(rank.ok()) << rank.status() << " (this test needs a GPU)";
    if (!rank.ok()) return {};
    ranks.push_back(*std::move(rank));
  }
  return ranks;
}

TEST(CudaIpcTransportTest, AwaitFromInsideAGroupIsRefusedAndLeavesItUsable) {
  std::vector<std::unique_ptr<CudaIpcTransport>> ranks = TwoRanks();
  ASSERT_EQ(ranks.size(), 2u);
  CudaIpcTransport& t = *ranks[0];
  ASSERT_TRUE(t.GroupStart().ok());
  const absl::Status inside =
      t.AwaitFrom(1, 4, DType::kFloat32, absl::Milliseconds(10));
  EXPECT_EQ(inside.code(), absl::StatusCode::kFailedPrecondition) << inside;
  EXPECT_THAT(inside.message(), HasSubstr("inside a group"));
  EXPECT_TRUE(t.GroupEnd().ok());
  // Usable, and outside a group the wait reaches the control connection:
  // nothing was sent, so it times out, resumable.
  const absl::Status idle =
      t.AwaitFrom(1, 4, DType::kFloat32, absl::Milliseconds(50));
  EXPECT_EQ(idle.code(), absl::StatusCode::kDeadlineExceeded) << idle;
}

TEST(CudaIpcTransportTest, GroupEndWithoutGroupStartBreaksIt) {
  std::vector<std::unique_ptr<CudaIpcTransport>> ranks = TwoRanks();
  ASSERT_EQ(ranks.size(), 2u);
  CudaIpcTransport& t = *ranks[1];
  const absl::Status end = t.GroupEnd();
  EXPECT_EQ(end.code(), absl::StatusCode::kFailedPrecondition) << end;
  EXPECT_THAT(end.message(), HasSubstr("GroupEnd without a matching"));
  // Broken: later calls fail with the same reason.
  const absl::Status later = t.GroupStart();
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_THAT(later.message(), HasSubstr("GroupEnd without a matching"));
  EXPECT_FALSE(t.AwaitFrom(0, 4, DType::kFloat32, absl::Milliseconds(10)).ok());
}

}  // namespace
}  // namespace transport
}  // namespace muonps
