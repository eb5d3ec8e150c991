// Test fixture of the GPU Newton-Schulz engine tests: two lanes (cuBLAS
// handles, streams, workspaces) and Run(), NS of a stack of matrices on a
// fresh NsEngine from and to host memory. Needs a CUDA GPU. Tests only
// (testonly in BUILD).
#ifndef MUONPS_KERNELS_CUDA_NS_ENGINE_FIXTURE_H_
#define MUONPS_KERNELS_CUDA_NS_ENGINE_FIXTURE_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/ns_engine.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace ns_test {

struct Shape {
  int64_t rows, cols;
};

class NsEngineTest : public ::testing::Test {
 protected:
  // Handles and workspaces for two lanes; the engine points each handle
  // at its stream and workspace itself.
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
              cudaSuccess)
        << "this test needs a CUDA GPU";
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
    auto ws = DeviceBuffer::Allocate(64 << 20, "cuBLAS workspace");
    ASSERT_TRUE(ws.ok()) << ws.status();
    workspace_ = std::move(*ws);
    ASSERT_EQ(cudaStreamCreateWithFlags(&side_stream_, cudaStreamNonBlocking),
              cudaSuccess);
    ASSERT_EQ(cublasCreate(&side_handle_), CUBLAS_STATUS_SUCCESS);
    auto side = DeviceBuffer::Allocate(64 << 20, "second cuBLAS workspace");
    ASSERT_TRUE(side.ok()) << side.status();
    side_workspace_ = std::move(*side);
  }
  void TearDown() override {
    cublasDestroy(side_handle_);
    cudaStreamDestroy(side_stream_);
    cublasDestroy(handle_);
    cudaStreamDestroy(stream_);
  }

  // NS of `count` matrices (stored back to back in `in`) on a fresh engine.
  std::vector<float> Run(cudaDataType low, const SymmetricPlan& plan,
                         const std::vector<float>& in, int64_t count, Shape s,
                         const NewtonSchulzOptions& options,
                         unsigned int* drift = nullptr, int lanes = 1) {
    std::vector<NsLane> lane_list = {
        {handle_, workspace_.get(), workspace_.bytes()}};
    if (lanes == 2) {
      lane_list.push_back({side_handle_, side_workspace_.get(),
                           side_workspace_.bytes(), side_stream_});
    }
    NsEngine engine(lane_list, low, plan, /*use_graphs=*/true);
    const size_t bytes = in.size() * sizeof(float);
    auto x = DeviceBuffer::Allocate(bytes, "input");
    auto y = DeviceBuffer::Allocate(bytes, "output");
    EXPECT_TRUE(x.ok() && y.ok());
    EXPECT_EQ(cudaMemcpy(x->get(), in.data(), bytes, cudaMemcpyHostToDevice),
              cudaSuccess);
    const absl::Status status =
        engine.Run(x->as<float>(), y->as<float>(), count, s.rows, s.cols,
                   options, stream_);
    EXPECT_TRUE(status.ok()) << status;
    std::vector<float> out(in.size());
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), y->get(), bytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    if (drift != nullptr && options.algorithm == NsAlgorithm::kGram) {
      const absl::StatusOr<unsigned int> d =
          engine.DriftCount(count, s.rows, s.cols);
      EXPECT_TRUE(d.ok()) << d.status();
      *drift = d.ok() ? *d : 1;
    }
    return out;
  }

  cudaStream_t stream_ = nullptr;
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  cudaStream_t side_stream_ = nullptr;
  cublasHandle_t side_handle_ = nullptr;
  DeviceBuffer side_workspace_;
};

}  // namespace ns_test
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_NS_ENGINE_FIXTURE_H_
