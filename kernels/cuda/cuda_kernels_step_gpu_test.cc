// Runs the CUDA backend's Muon and AdamW steps on a GPU against the CPU
// backend, and its finite checks, which name the matrix (or the expert)
// and leave device state untouched. Needs a GPU: tagged manual, run on the
// GPU machine by deploy/device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
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
using cuda_kernels_test::Shape;
using reference::GaussianMatrix;
using reference::RelativeError;
using ::testing::HasSubstr;

// Five Muon steps on the GPU and the CPU from the same state.
void MuonStepsAgree(Precision p, NsAlgorithm algorithm, Shape s,
                    double param_bound) {
  MuonHyperparameters hyper;
  hyper.lr = 0.02;
  hyper.weight_decay = 0.1;
  hyper.ns.algorithm = algorithm;
  std::vector<float> gpu_param = GaussianMatrix(s.count * s.rows, s.cols, 2);
  std::vector<float> gpu_momentum(s.size(), 0.0f);
  std::vector<float> cpu_param = gpu_param, cpu_momentum = gpu_momentum;
  CpuKernels cpu;
  auto gpu = Gpu(p);
  ASSERT_NE(gpu, nullptr);
  std::vector<std::string> names;
  for (int64_t i = 0; i < s.count; ++i)
    names.push_back("w" + std::to_string(i));
  for (int step = 0; step < 5; ++step) {
    std::vector<float> grad =
        GaussianMatrix(s.count * s.rows, s.cols, 100 + step);
    const auto stack = [&](std::vector<float>& m, std::vector<float>& param) {
      return MuonStack{names,
                       {grad.data(), s.count, s.rows, s.cols},
                       {m.data(), s.count, s.rows, s.cols},
                       {param.data(), s.count, s.rows, s.cols}};
    };
    ASSERT_TRUE(
        gpu->MuonStep(stack(gpu_momentum, gpu_param), hyper, kHostStream).ok());
    ASSERT_TRUE(
        cpu.MuonStep(stack(cpu_momentum, cpu_param), hyper, kHostStream).ok());
  }
  // Momentum never touches NS: the fused kernel equals the CPU bit for bit.
  EXPECT_EQ(gpu_momentum, cpu_momentum);
  const double err = RelativeError(gpu_param, cpu_param);
  std::printf("muon %s %s param rel_err %.3g\n",
              std::string(PrecisionName(p)).c_str(),
              std::string(NsAlgorithmName(algorithm)).c_str(), err);
  EXPECT_LT(err, param_bound) << PrecisionName(p);
}

TEST(CudaMuonStepTest, FiveStepsMatchCpu) {
  for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    MuonStepsAgree(Precision::kFp32, a, {4, 48, 160}, 1e-5);
    // An NS output off by the bf16 bound moves params by lr * that.
    MuonStepsAgree(Precision::kBf16, a, {4, 160, 48}, 1e-3);
  }
}

// The update a step applies is Newton-Schulz's result rounded to the
// precision it iterated in (torch.optim.Muon's update is bf16): MuonStep
// equals momentum, Orthogonalize, the rounding and the apply of the 16-bit
// values, bit for bit; in fp32 nothing is rounded.
TEST(CudaMuonStepTest, TheUpdateIsRoundedToThePrecision) {
  const Shape s{3, 64, 96};
  for (const Precision p :
       {Precision::kFp32, Precision::kBf16, Precision::kFp16}) {
    auto gpu = Gpu(p);
    ASSERT_NE(gpu, nullptr);
    const DType update_dtype = gpu->update_dtype();
    EXPECT_EQ(DTypeName(update_dtype), PrecisionName(p));
    MuonHyperparameters hyper;
    hyper.lr = 0.02;
    hyper.weight_decay = 0.1;
    std::vector<float> grad = GaussianMatrix(s.count * s.rows, s.cols, 11);
    std::vector<float> param = GaussianMatrix(s.count * s.rows, s.cols, 12);
    std::vector<float> momentum(s.size(), 0.0f);
    std::vector<float> want_param = param, want_momentum = momentum;
    ASSERT_TRUE(
        gpu->MuonStep(MuonStack{{"w"},
                                {grad.data(), s.count, s.rows, s.cols},
                                {momentum.data(), s.count, s.rows, s.cols},
                                {param.data(), s.count, s.rows, s.cols}},
                      hyper, kHostStream)
            .ok());
    std::vector<float> update(s.size());
    const MatrixStack g{grad.data(), s.count, s.rows, s.cols};
    const MatrixStack m{want_momentum.data(), s.count, s.rows, s.cols};
    const MatrixStack u{update.data(), s.count, s.rows, s.cols};
    ASSERT_TRUE(gpu->UpdateMomentum(g, m, m, hyper.momentum, hyper.nesterov, u,
                                    kHostStream)
                    .ok());
    ASSERT_TRUE(gpu->Orthogonalize(u, u, hyper.ns, kHostStream).ok());
    std::vector<uint16_t> narrow(s.size());
    if (update_dtype != DType::kFloat32) {
      FromFloat(update_dtype, update.data(), update.size(), narrow.data());
      ToFloat(update_dtype, narrow.data(), narrow.size(), update.data());
    }
    const float decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
    const float step = static_cast<float>(
        -AdjustedLr(hyper.lr, hyper.lr_adjustment, s.rows, s.cols));
    for (size_t i = 0; i < want_param.size(); ++i) {
      want_param[i] = want_param[i] * decay + step * update[i];
    }
    EXPECT_EQ(momentum, want_momentum) << PrecisionName(p);
    EXPECT_EQ(param, want_param) << PrecisionName(p);
  }
}

TEST(CudaMuonStepTest, NonFiniteGradientIsRejectedByNameAndNothingIsWritten) {
  auto created = CudaKernels::Create({});
  ASSERT_TRUE(created.ok()) << created.status();
  CudaKernels& gpu = **created;
  const Stream stream = NewStream();
  ASSERT_NE(stream, nullptr);
  const int64_t count = 4, rows = 8, cols = 8, size = count * rows * cols;
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    std::vector<float> grad = GaussianMatrix(count * rows, cols, 1);
    grad[2 * 64 + 3 * 8 + 5] = bad;  // matrix 2, element [3, 5]
    const std::vector<float> param = GaussianMatrix(count * rows, cols, 2);
    const std::vector<float> momentum = GaussianMatrix(count * rows, cols, 3);
    float* device[3] = {nullptr, nullptr, nullptr};
    const std::vector<float>* host[3] = {&grad, &momentum, &param};
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(cudaMalloc(&device[i], size * sizeof(float)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(device[i], host[i]->data(), size * sizeof(float),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    const MuonStack stack{{"l.0", "l.1", "l.2", "l.3"},
                          {device[0], count, rows, cols},
                          {device[1], count, rows, cols},
                          {device[2], count, rows, cols}};
    const absl::Status status = gpu.MuonStep(stack, {}, stream);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("\"l.2\""));
    EXPECT_THAT(std::string(status.message()), HasSubstr("[3, 5]"));
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(std::isnan(bad) ? "NaN" : "Inf"));
    std::vector<float> after(size);
    for (int i = 1; i < 3; ++i) {
      ASSERT_EQ(cudaMemcpy(after.data(), device[i], size * sizeof(float),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(after, *host[i]) << (i == 1 ? "momentum" : "param");
    }
    for (float* d : device) cudaFree(d);
  }
  cudaStreamDestroy(stream);
}

TEST(CudaMuonStepTest, CheckFiniteNamesTheExpert) {
  auto gpu = Gpu(Precision::kBf16);
  ASSERT_NE(gpu, nullptr);
  std::vector<float> grad(3 * 4 * 4, 1.0f);
  EXPECT_TRUE(
      gpu->CheckFinite({grad.data(), 3, 4, 4}, {"moe.w1"}, kHostStream).ok());
  grad[2 * 16 + 7] = -std::numeric_limits<float>::infinity();
  const absl::Status status =
      gpu->CheckFinite({grad.data(), 3, 4, 4}, {"moe.w1"}, kHostStream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("\"moe.w1\"[expert 2]"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("[1, 3] is Inf"));
}

TEST(CudaAdamWTest, TenStepsEqualTheCpuBitForBitAndNaNWritesNothing) {
  const int64_t n = 1000;
  std::vector<float> gpu_p = GaussianMatrix(1, n, 4), cpu_p = gpu_p;
  std::vector<float> gpu_m(n, 0.0f), gpu_v(n, 0.0f), cpu_m(n, 0.0f),
      cpu_v(n, 0.0f);
  CpuKernels cpu;
  auto gpu = Gpu(Precision::kFp32);
  ASSERT_NE(gpu, nullptr);
  AdamWHyperparameters hyper;
  hyper.weight_decay = 0.1;
  for (int64_t step = 1; step <= 10; ++step) {
    const std::vector<float> grad = GaussianMatrix(1, n, 10 + step);
    ASSERT_TRUE(gpu->AdamWStep({"b", gpu_p.data(), grad.data(), gpu_m.data(),
                                gpu_v.data(), n},
                               hyper, step, kHostStream)
                    .ok());
    ASSERT_TRUE(cpu.AdamWStep({"b", cpu_p.data(), grad.data(), cpu_m.data(),
                               cpu_v.data(), n},
                              hyper, step, kHostStream)
                    .ok());
  }
  EXPECT_EQ(gpu_p, cpu_p);
  EXPECT_EQ(gpu_m, cpu_m);
  EXPECT_EQ(gpu_v, cpu_v);
  std::vector<float> grad(n, 0.5f);
  grad[321] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> before = gpu_p;
  const absl::Status status = gpu->AdamWStep(
      {"b", gpu_p.data(), grad.data(), gpu_m.data(), gpu_v.data(), n}, hyper,
      11, kHostStream);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("element 321 is NaN"));
  EXPECT_EQ(gpu_p, before);
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
