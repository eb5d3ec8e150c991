// CudaIpcTransport's group rules, as on the TCP and NCCL transports: a wait
// inside a group is refused and leaves the transport usable; a GroupEnd
// with no group open breaks it; a split's sum over a group of one. Two ranks as
// threads of one process on GPU 0 (their transfers need two processes: CUDA IPC
// does not open a process's own memory; the worker's GPU tests move data).
// Needs a GPU: tagged manual, run on the GPU machine by deploy/device.
#include <cuda_runtime.h>

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

// ReduceSumIn within a split: over a group of one it is that member's own
// part, copied on the device into another buffer or left in place (inside
// a group too); a root outside the group and an order that is not a
// permutation of its members are refused, naming the call and the split.
TEST(CudaIpcTransportTest, ReduceSumInOverAGroupOfOneIsItsOwnPart) {
  std::vector<std::unique_ptr<CudaIpcTransport>> ranks = TwoRanks();
  ASSERT_EQ(ranks.size(), 2u);
  for (std::unique_ptr<CudaIpcTransport>& rank : ranks) {
    ASSERT_TRUE(rank->FormSplit(Split::kRails, {{1}, {0}}).ok());
  }
  constexpr size_t kCount = 4099;
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) values[i] = 0.5f * i - 1000.25f;
  float* send = nullptr;
  float* recv = nullptr;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&send, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(send, values.data(), kCount * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  CudaIpcTransport& t = *ranks[0];
  absl::Status status =
      t.ReduceSumIn(Split::kRails, send, recv, kCount, 0, {}, stream);
  ASSERT_TRUE(status.ok()) << status;
  const int order[] = {0};
  ASSERT_TRUE(t.GroupStart().ok());
  status = t.ReduceSumIn(Split::kRails, send, send, kCount, 0, order, stream);
  ASSERT_TRUE(status.ok()) << status;
  status = t.GroupEnd();
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> got(kCount);
  ASSERT_EQ(cudaMemcpy(got.data(), recv, kCount * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, values);
  ASSERT_EQ(cudaMemcpy(got.data(), send, kCount * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(got, values);

  const absl::Status root =
      t.ReduceSumIn(Split::kRails, send, recv, kCount, 1, {}, stream);
  EXPECT_EQ(root.code(), absl::StatusCode::kInvalidArgument) << root;
  EXPECT_THAT(root.message(), HasSubstr("ReduceSumIn(rails): root 1 is not in "
                                        "rank 0's group (ranks 0)"));
  const int both[] = {0, 1};
  const absl::Status permutation =
      ranks[1]->ReduceSumIn(Split::kRails, send, recv, kCount, 1, both, stream);
  EXPECT_EQ(permutation.code(), absl::StatusCode::kInvalidArgument)
      << permutation;
  EXPECT_THAT(permutation.message(),
              HasSubstr("ReduceSumIn(rails): order is not a permutation of "
                        "rank 1's group (ranks 1)"));
  cudaStreamDestroy(stream);
  cudaFree(send);
  cudaFree(recv);
}

}  // namespace
}  // namespace transport
}  // namespace muonps
