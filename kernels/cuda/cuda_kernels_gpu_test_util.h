// What the CUDA backend's GPU tests share: a stack's Shape, a
// HostStagingKernels of a precision (Gpu), a new stream, one NS call on
// host memory (RunNs) and its options. Tests only (testonly in BUILD).
#ifndef MUONPS_KERNELS_CUDA_CUDA_KERNELS_GPU_TEST_UTIL_H_
#define MUONPS_KERNELS_CUDA_CUDA_KERNELS_GPU_TEST_UTIL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host_staging_kernels.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace cuda_kernels_test {

struct Shape {
  int64_t count, rows, cols;
  int64_t size() const { return count * rows * cols; }
};

inline std::unique_ptr<HostStagingKernels> Gpu(Precision precision,
                                               bool graphs = true) {
  CudaKernelsOptions options;
  options.precision = precision;
  options.use_graphs = graphs;
  auto kernels = HostStagingKernels::Create(options);
  EXPECT_TRUE(kernels.ok()) << kernels.status();
  return kernels.ok() ? std::move(*kernels) : nullptr;
}

// A non-blocking stream of the current device, or null (the test then
// fails on its first use).
inline Stream NewStream() {
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  return stream;
}

inline std::vector<float> RunNs(MuonKernels* kernels,
                                const std::vector<float>& in, Shape s,
                                const NewtonSchulzOptions& options) {
  std::vector<float> data = in, out(in.size(), -1.0f);
  const absl::Status status = kernels->Orthogonalize(
      {data.data(), s.count, s.rows, s.cols},
      {out.data(), s.count, s.rows, s.cols}, options, kHostStream);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

inline NewtonSchulzOptions Options(NsAlgorithm algorithm, bool polar = false) {
  NewtonSchulzOptions o;
  o.algorithm = algorithm;
  o.polar_express = polar;
  return o;
}

}  // namespace cuda_kernels_test
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_CUDA_KERNELS_GPU_TEST_UTIL_H_
