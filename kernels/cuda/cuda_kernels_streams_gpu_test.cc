// Runs one CUDA backend's calls on several streams on a GPU: a graph
// captured on one stream replays on another, stacks sharing a workspace
// queued on two streams at once come out as the eager results, a call
// after its predecessor's stream was destroyed still works, and every call
// refuses the null (host) stream. Needs a GPU: tagged manual, run on the
// GPU machine by deploy/device.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_kernels_gpu_test_util.h"
#include "kernels/cuda/host_staging_kernels.h"
#include "kernels/reference/reference_muon.h"
#include "kernels/reference/test_matrices.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

using cuda_kernels_test::Gpu;
using cuda_kernels_test::NewStream;
using cuda_kernels_test::Options;
using cuda_kernels_test::RunNs;
using cuda_kernels_test::Shape;
using reference::GaussianMatrix;
using reference::RelativeError;
using ::testing::HasSubstr;

// A device copy of `host` (freed by the caller with cudaFree).
float* DeviceCopy(const std::vector<float>& host) {
  float* device = nullptr;
  EXPECT_EQ(cudaMalloc(&device, host.size() * sizeof(float)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device, host.data(), host.size() * sizeof(float),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  return device;
}

std::vector<float> HostCopy(const float* device, size_t count) {
  std::vector<float> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(float),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// One CudaKernels serving calls on two streams: a graph captured for a
// call on stream A replays on stream B, two same-shape stacks (one shared
// workspace) queued back to back on A and B without a host wait both come
// out as the eager single-stream results, and a call on B after A was
// destroyed still works.
TEST(CudaStreamsTest,
     GraphsReplayOnAnyStreamAndStreamsSharingWorkspacesAreOrdered) {
  const Shape s{4, 512, 1536};
  const std::vector<float> x = GaussianMatrix(s.count * s.rows, s.cols, 71);
  const std::vector<float> y = GaussianMatrix(s.count * s.rows, s.cols, 72);
  for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    auto eager = Gpu(Precision::kBf16, /*graphs=*/false);
    ASSERT_NE(eager, nullptr);
    const std::vector<float> want_x = RunNs(eager.get(), x, s, Options(a));
    const std::vector<float> want_y = RunNs(eager.get(), y, s, Options(a));

    CudaKernelsOptions options;
    options.precision = Precision::kBf16;
    auto created = CudaKernels::Create(options);
    ASSERT_TRUE(created.ok()) << created.status();
    CudaKernels& gpu = **created;
    Stream first = NewStream(), second = NewStream();
    ASSERT_TRUE(first != nullptr && second != nullptr);
    float* in_x = DeviceCopy(x);
    float* in_y = DeviceCopy(y);
    float* out_x = DeviceCopy(std::vector<float>(s.size(), -1.0f));
    float* out_y = DeviceCopy(std::vector<float>(s.size(), -1.0f));
    const MatrixStack stack_x{in_x, s.count, s.rows, s.cols};
    const MatrixStack stack_y{in_y, s.count, s.rows, s.cols};
    const MatrixStack result_x{out_x, s.count, s.rows, s.cols};
    const MatrixStack result_y{out_y, s.count, s.rows, s.cols};

    // Captured for (and first launched on) the first stream, then replayed
    // on the second.
    ASSERT_TRUE(gpu.Orthogonalize(stack_x, result_x, Options(a), first).ok());
    ASSERT_TRUE(gpu.Synchronize(first).ok());
    ASSERT_EQ(cudaMemset(out_x, 0, s.size() * sizeof(float)), cudaSuccess);
    ASSERT_TRUE(gpu.Orthogonalize(stack_x, result_x, Options(a), second).ok());
    ASSERT_TRUE(gpu.Synchronize(second).ok());
    EXPECT_LT(RelativeError(HostCopy(out_x, s.size()), want_x), 1e-6)
        << NsAlgorithmName(a) << " replay";

    // Two graphs over one workspace, queued on two streams at once.
    ASSERT_EQ(cudaMemset(out_x, 0, s.size() * sizeof(float)), cudaSuccess);
    for (int round = 0; round < 3; ++round) {
      ASSERT_TRUE(gpu.Orthogonalize(stack_x, result_x, Options(a), first).ok());
      ASSERT_TRUE(
          gpu.Orthogonalize(stack_y, result_y, Options(a), second).ok());
    }
    ASSERT_TRUE(gpu.Synchronize(first).ok());
    ASSERT_TRUE(gpu.Synchronize(second).ok());
    EXPECT_LT(RelativeError(HostCopy(out_x, s.size()), want_x), 1e-6)
        << NsAlgorithmName(a) << " two streams, first";
    EXPECT_LT(RelativeError(HostCopy(out_y, s.size()), want_y), 1e-6)
        << NsAlgorithmName(a) << " two streams, second";

    // The previous call's stream is gone: the next call still orders after
    // it without touching it.
    ASSERT_TRUE(gpu.Orthogonalize(stack_x, result_x, Options(a), first).ok());
    ASSERT_EQ(cudaStreamDestroy(first), cudaSuccess);
    ASSERT_TRUE(gpu.Orthogonalize(stack_y, result_y, Options(a), second).ok());
    ASSERT_TRUE(gpu.Synchronize(second).ok());
    EXPECT_LT(RelativeError(HostCopy(out_y, s.size()), want_y), 1e-6)
        << NsAlgorithmName(a) << " after the first stream was destroyed";

    for (float* d : {in_x, in_y, out_x, out_y}) cudaFree(d);
    cudaStreamDestroy(second);
  }
}

TEST(CudaStreamsTest, EveryCallRefusesTheHostStream) {
  auto created = CudaKernels::Create({});
  ASSERT_TRUE(created.ok()) << created.status();
  CudaKernels& gpu = **created;
  float* data = DeviceCopy(std::vector<float>(16, 1.0f));
  float* other = DeviceCopy(std::vector<float>(16, 2.0f));
  float* third = DeviceCopy(std::vector<float>(16, 3.0f));
  const MatrixStack a{data, 1, 4, 4}, b{other, 1, 4, 4}, c{third, 1, 4, 4};
  const AdamWTensor tensor{"bias", data, other, third, third, 16};
  const absl::Status refused[] = {
      gpu.CheckFinite(a, {"w"}, kHostStream),
      gpu.UpdateMomentum(a, b, b, 0.9, true, c, kHostStream),
      gpu.Orthogonalize(a, c, {}, kHostStream),
      gpu.ApplyUpdate(a, b, 0.1, 0.1, LrAdjustment::kOriginal, kHostStream),
      gpu.MuonStep({{"w"}, a, b, c}, {}, kHostStream),
      gpu.AdamWStep(tensor, {}, 1, kHostStream),
      gpu.Synchronize(kHostStream),
  };
  for (const absl::Status& status : refused) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("stream"));
  }
  EXPECT_EQ(HostCopy(data, 16), std::vector<float>(16, 1.0f));
  EXPECT_EQ(HostCopy(other, 16), std::vector<float>(16, 2.0f));
  for (float* d : {data, other, third}) cudaFree(d);
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
