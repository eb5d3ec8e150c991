// Runs the CUDA elementwise kernels on a GPU and checks them against the CPU
// backend bit for bit. Needs a GPU: tagged manual, run on the GPU machine
// (see kernels/README.md, "On a GPU machine").
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_device_ops.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/reference/test_matrices.h"

namespace muonps {
namespace kernels {
namespace {

using cuda::LaunchApplyUpdate;
using cuda::LaunchFindNonFinite;
using cuda::LaunchMomentum;

// A device copy of a host vector, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<float>& host) : size_(host.size()) {
    EXPECT_EQ(cudaMalloc(&data_, size_ * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.data(), size_ * sizeof(float),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }

  float* get() const { return data_; }
  std::vector<float> ToHost() const {
    std::vector<float> host(size_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, size_ * sizeof(float),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    return host;
  }

 private:
  float* data_ = nullptr;
  size_t size_;
};

class ElementwiseGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess)
        << "this test needs a CUDA GPU";
    ASSERT_GT(devices, 0);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override { cudaStreamDestroy(stream_); }

  cudaStream_t stream_ = nullptr;
};

TEST_F(ElementwiseGpuTest, MomentumAndApplyEqualTheCpuBackendBitForBit) {
  const int64_t rows = 257, cols = 96, n = rows * cols;
  const std::vector<float> grad = reference::GaussianMatrix(rows, cols, 1);
  const std::vector<float> momentum0 = reference::GaussianMatrix(rows, cols, 2);
  const std::vector<float> param0 = reference::GaussianMatrix(rows, cols, 3);
  for (const bool nesterov : {true, false}) {
    std::vector<float> cpu_grad = grad, cpu_momentum = momentum0;
    std::vector<float> cpu_update(n), cpu_param = param0;
    CpuKernels cpu;
    ASSERT_TRUE(cpu.UpdateMomentum({cpu_grad.data(), 1, rows, cols},
                                   {cpu_momentum.data(), 1, rows, cols},
                                   {cpu_momentum.data(), 1, rows, cols}, 0.95,
                                   nesterov, {cpu_update.data(), 1, rows, cols},
                                   kHostStream)
                    .ok());
    ASSERT_TRUE(cpu.ApplyUpdate({cpu_param.data(), 1, rows, cols},
                                {cpu_update.data(), 1, rows, cols}, 0.02, 0.1,
                                LrAdjustment::kOriginal, kHostStream)
                    .ok());

    DeviceBuffer d_grad(grad), d_momentum(momentum0), d_param(param0);
    DeviceBuffer d_update{std::vector<float>(n)};
    ASSERT_EQ(LaunchMomentum(d_grad.get(), d_momentum.get(), d_momentum.get(),
                             d_update.get(), n, 0.95, nesterov, stream_),
              cudaSuccess);
    const float decay = static_cast<float>(1.0 - 0.02 * 0.1);
    const float step = static_cast<float>(
        -AdjustedLr(0.02, LrAdjustment::kOriginal, rows, cols));
    ASSERT_EQ(LaunchApplyUpdate(d_param.get(), CUDA_R_32F, d_update.get(),
                                CUDA_R_32F, n, decay, step, stream_),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(d_momentum.ToHost(), cpu_momentum) << nesterov;
    EXPECT_EQ(d_update.ToHost(), cpu_update) << nesterov;
    EXPECT_EQ(d_param.ToHost(), cpu_param) << nesterov;
  }
}

TEST_F(ElementwiseGpuTest, FindNonFiniteReportsTheFirstBadIndex) {
  std::vector<float> data(1 << 20, 1.0f);
  data[777777] = std::numeric_limits<float>::infinity();
  data[900000] = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer d_data(data);
  unsigned long long* d_first = nullptr;
  ASSERT_EQ(cudaMalloc(&d_first, sizeof(*d_first)), cudaSuccess);
  const unsigned long long none = std::numeric_limits<int64_t>::max();
  ASSERT_EQ(cudaMemcpy(d_first, &none, sizeof(none), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(LaunchFindNonFinite(d_data.get(), data.size(), d_first, stream_),
            cudaSuccess);
  unsigned long long first = 0;
  ASSERT_EQ(cudaMemcpyAsync(&first, d_first, sizeof(first),
                            cudaMemcpyDeviceToHost, stream_),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  cudaFree(d_first);
  EXPECT_EQ(first, 777777u);
}

// The worker's DeviceOps on the GPU against the CPU's, bit for bit: both
// dtypes of a lent parameter, the bf16 conversions, and odd sizes and
// offsets (the kernels' four-wide path, its tail, and misaligned starts).
TEST_F(ElementwiseGpuTest, DeviceOpsEqualTheCpusForBothDtypes) {
  absl::StatusOr<std::unique_ptr<cuda::CudaDeviceOps>> gpu =
      cuda::CudaDeviceOps::Create(0, stream_);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CpuDeviceOps cpu;
  const int64_t n = 1003;
  const std::vector<float> update = reference::GaussianMatrix(1, n, 4);
  const std::vector<float> start = reference::GaussianMatrix(1, n, 5);
  for (const int64_t offset : {0, 1}) {
    const int64_t count = n - offset;
    // fp32 parameter.
    std::vector<float> cpu_param = start;
    ASSERT_TRUE(cpu.ApplyScaled(cpu_param.data() + offset, DType::kFloat32,
                                update.data() + offset, DType::kFloat32, count,
                                0.998f, -0.03f, kHostStream)
                    .ok());
    DeviceBuffer d_param(start), d_update(update);
    ASSERT_TRUE((*gpu)
                    ->ApplyScaled(d_param.get() + offset, DType::kFloat32,
                                  d_update.get() + offset, DType::kFloat32,
                                  count, 0.998f, -0.03f, stream_)
                    .ok());
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(d_param.ToHost(), cpu_param) << offset;
    // bf16 parameter: narrowed on both, updated, widened back.
    std::vector<uint16_t> cpu16(n);
    ASSERT_TRUE(cpu.FromFloat(cpu16.data(), DType::kBFloat16, start.data(), n,
                              kHostStream)
                    .ok());
    ASSERT_TRUE(cpu.ApplyScaled(cpu16.data() + offset, DType::kBFloat16,
                                update.data() + offset, DType::kFloat32, count,
                                0.998f, -0.03f, kHostStream)
                    .ok());
    std::vector<float> cpu_wide(n);
    ASSERT_TRUE(cpu.ToFloat(cpu_wide.data(), cpu16.data(), DType::kBFloat16, n,
                            kHostStream)
                    .ok());
    DeviceBuffer d_start(start), d_wide{std::vector<float>(n)};
    uint16_t* d16 = nullptr;
    ASSERT_EQ(cudaMalloc(&d16, n * 2), cudaSuccess);
    ASSERT_TRUE(
        (*gpu)
            ->FromFloat(d16, DType::kBFloat16, d_start.get(), n, stream_)
            .ok());
    ASSERT_TRUE((*gpu)
                    ->ApplyScaled(d16 + offset, DType::kBFloat16,
                                  d_update.get() + offset, DType::kFloat32,
                                  count, 0.998f, -0.03f, stream_)
                    .ok());
    ASSERT_TRUE(
        (*gpu)->ToFloat(d_wide.get(), d16, DType::kBFloat16, n, stream_).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<uint16_t> gpu16(n);
    ASSERT_EQ(cudaMemcpy(gpu16.data(), d16, n * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
    cudaFree(d16);
    EXPECT_EQ(gpu16, cpu16) << offset;
    EXPECT_EQ(d_wide.ToHost(), cpu_wide) << offset;
  }
  // Momentum over an odd count at a misaligned start (the scalar path).
  const std::vector<float> grad = reference::GaussianMatrix(1, n, 6);
  std::vector<float> cpu_momentum = start, cpu_out(n);
  CpuKernels cpu_kernels;
  ASSERT_TRUE(
      cpu_kernels
          .UpdateMomentum({const_cast<float*>(grad.data()) + 1, 1, 1, n - 1},
                          {cpu_momentum.data() + 1, 1, 1, n - 1},
                          {cpu_momentum.data() + 1, 1, 1, n - 1}, 0.9, true,
                          {cpu_out.data() + 1, 1, 1, n - 1}, kHostStream)
          .ok());
  DeviceBuffer d_grad(grad), d_momentum(start), d_out{std::vector<float>(n)};
  ASSERT_EQ(LaunchMomentum(d_grad.get() + 1, d_momentum.get() + 1,
                           d_momentum.get() + 1, d_out.get() + 1, n - 1, 0.9,
                           true, stream_),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  EXPECT_EQ(d_momentum.ToHost(), cpu_momentum);
  EXPECT_EQ(d_out.ToHost(), cpu_out);
}

// A Muon update in 16 bits (the precision Newton-Schulz ran in) narrowed,
// applied to either parameter dtype and widened on the GPU, equals the CPU's
// bit for bit, at an odd size and a misaligned start.
TEST_F(ElementwiseGpuTest, SixteenBitUpdatesEqualTheCpusForEveryDtype) {
  absl::StatusOr<std::unique_ptr<cuda::CudaDeviceOps>> gpu =
      cuda::CudaDeviceOps::Create(0, stream_);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CpuDeviceOps cpu;
  const int64_t n = 1003;
  const std::vector<float> update = reference::GaussianMatrix(1, n, 7);
  const std::vector<float> start = reference::GaussianMatrix(1, n, 8);
  DeviceBuffer d_update(update), d_start(start);
  for (const DType update_dtype : {DType::kBFloat16, DType::kFloat16}) {
    std::vector<uint16_t> cpu_narrow(n);
    ASSERT_TRUE(cpu.FromFloat(cpu_narrow.data(), update_dtype, update.data(), n,
                              kHostStream)
                    .ok());
    uint16_t* d_narrow = nullptr;
    ASSERT_EQ(cudaMalloc(&d_narrow, n * 2), cudaSuccess);
    ASSERT_TRUE(
        (*gpu)
            ->FromFloat(d_narrow, update_dtype, d_update.get(), n, stream_)
            .ok());
    std::vector<uint16_t> gpu_narrow(n);
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    ASSERT_EQ(
        cudaMemcpy(gpu_narrow.data(), d_narrow, n * 2, cudaMemcpyDeviceToHost),
        cudaSuccess);
    EXPECT_EQ(gpu_narrow, cpu_narrow) << DTypeName(update_dtype);
    // Aligned (four elements a thread) and misaligned (one) starts.
    for (const int64_t offset : {0, 1}) {
      for (const DType param_dtype : {DType::kFloat32, DType::kBFloat16}) {
        const size_t bytes = n * DTypeSize(param_dtype);
        std::vector<char> cpu_param(bytes);
        ASSERT_TRUE(cpu.FromFloat(cpu_param.data(), param_dtype, start.data(),
                                  n, kHostStream)
                        .ok());
        ASSERT_TRUE(
            cpu.ApplyScaled(ElementsPast(cpu_param.data(), param_dtype, offset),
                            param_dtype, cpu_narrow.data() + offset,
                            update_dtype, n - offset, 0.998f, -0.03f,
                            kHostStream)
                .ok());
        void* d_param = nullptr;
        ASSERT_EQ(cudaMalloc(&d_param, bytes), cudaSuccess);
        ASSERT_TRUE(
            (*gpu)
                ->FromFloat(d_param, param_dtype, d_start.get(), n, stream_)
                .ok());
        ASSERT_TRUE(
            (*gpu)
                ->ApplyScaled(ElementsPast(d_param, param_dtype, offset),
                              param_dtype, d_narrow + offset, update_dtype,
                              n - offset, 0.998f, -0.03f, stream_)
                .ok());
        ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
        std::vector<char> gpu_param(bytes);
        ASSERT_EQ(cudaMemcpy(gpu_param.data(), d_param, bytes,
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
        cudaFree(d_param);
        EXPECT_EQ(gpu_param, cpu_param)
            << DTypeName(update_dtype) << " onto " << DTypeName(param_dtype)
            << " at " << offset;
      }
    }
    // And widened back on the device.
    DeviceBuffer d_wide{std::vector<float>(n)};
    ASSERT_TRUE(
        (*gpu)->ToFloat(d_wide.get(), d_narrow, update_dtype, n, stream_).ok());
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<float> cpu_wide(n);
    ASSERT_TRUE(cpu.ToFloat(cpu_wide.data(), cpu_narrow.data(), update_dtype, n,
                            kHostStream)
                    .ok());
    EXPECT_EQ(d_wide.ToHost(), cpu_wide) << DTypeName(update_dtype);
    cudaFree(d_narrow);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace muonps
