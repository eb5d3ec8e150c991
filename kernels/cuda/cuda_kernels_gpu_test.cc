// Runs the CUDA backend on a GPU against the CPU backend: Newton-Schulz
// (NS5 and Gram, wide, tall and square, batched) within the GEMM input
// precision's rounding, Muon and AdamW steps, the finite check that names
// the matrix and leaves device state untouched, graph reuse, and calls on
// several streams (graph replay, shared workspaces, the null stream
// refused). Needs a GPU: tagged manual, run on the GPU machine by
// deploy/device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/host_staging_kernels.h"
#include "kernels/reference/reference_muon.h"
#include "kernels/reference/test_matrices.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

using reference::GaussianMatrix;
using reference::RelativeError;
using ::testing::HasSubstr;

struct Shape {
  int64_t count, rows, cols;
  int64_t size() const { return count * rows * cols; }
};

// Relative Frobenius bound on |GPU - CPU fp32| / |CPU| for one NS call.
// With u the unit roundoff of the GEMM inputs (2^-8 bf16, 2^-11 fp16), each
// NS5 step rounds B = b A + c A^2 to the input precision; |B| reaches ~2.7
// where the new iterate is (a + B) X ~ 0.7 X, so B's rounding (u / sqrt(3)
// RMS) moves the iterate by ~4 u / sqrt(3), and the quintic's slope
// (|phi'| ~ 1.3 near its fixed points) carries each step's error forward:
// over 5 steps about 4.3 x 4 u / sqrt(3) ~ 10 u (measured: up to 9 u). The
// bound allows 16 u; Polar Express's larger early coefficients (|B| / |a + B|
// up to ~6) get twice that. Gram NS carries R <- P R P across the steps of a
// segment instead of recomputing A from X, so the rounding of P enters R
// twice per step and compounds (measured: up to 19 u, 42 u with Polar
// Express): twice NS5's bounds. fp32 runs the same arithmetic as the CPU in
// another summation order: 2e-5 (the CPU backend's own fp64 check is
// 1e-5); Gram's compounding products, 2e-4.
double Bound(Precision p, const NewtonSchulzOptions& o) {
  double factor = o.polar_express ? 32 : 16;
  if (o.algorithm == NsAlgorithm::kGram) factor *= 2;
  switch (p) {
    case Precision::kBf16:
      return factor * std::ldexp(1.0, -8);
    case Precision::kFp16:
      return factor * std::ldexp(1.0, -11);
    case Precision::kFp32:
      return o.algorithm == NsAlgorithm::kGram ? 2e-4 : 2e-5;
  }
  return 0;
}

std::unique_ptr<HostStagingKernels> Gpu(Precision precision,
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
Stream NewStream() {
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  return stream;
}

std::vector<float> RunNs(MuonKernels* kernels, const std::vector<float>& in,
                         Shape s, const NewtonSchulzOptions& options) {
  std::vector<float> data = in, out(in.size(), -1.0f);
  const absl::Status status = kernels->Orthogonalize(
      {data.data(), s.count, s.rows, s.cols},
      {out.data(), s.count, s.rows, s.cols}, options, kHostStream);
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

NewtonSchulzOptions Options(NsAlgorithm algorithm, bool polar = false) {
  NewtonSchulzOptions o;
  o.algorithm = algorithm;
  o.polar_express = polar;
  return o;
}

constexpr Precision kPrecisions[] = {Precision::kFp32, Precision::kBf16,
                                     Precision::kFp16};

TEST(CudaNsTest, MatchesCpuWithinInputRoundingOnWideTallSquareBatches) {
  const Shape shapes[] = {{3, 64, 256}, {2, 256, 64}, {4, 128, 128},
                          {2, 33, 97},  {2, 97, 33},  {1, 1, 300},
                          {3, 300, 1},  {2, 48, 200}};
  CpuKernels cpu;
  uint32_t seed = 1;
  for (const Precision p : kPrecisions) {
    auto gpu = Gpu(p);
    ASSERT_NE(gpu, nullptr);
    for (const Shape& s : shapes) {
      const std::vector<float> in =
          GaussianMatrix(s.count * s.rows, s.cols, seed++);
      for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
        for (const bool polar : {false, true}) {
          // Gram NS with Polar Express on square matrices (whose smallest
          // singular values are tiny) loses 0.6 (bf16) and 0.08 (fp16):
          // square matrices stay on NS5 (DESIGN.md); not a supported pair.
          if (a == NsAlgorithm::kGram && polar && s.rows == s.cols &&
              p != Precision::kFp32) {
            continue;
          }
          const NewtonSchulzOptions o = Options(a, polar);
          const double err =
              RelativeError(RunNs(gpu.get(), in, s, o), RunNs(&cpu, in, s, o));
          std::printf("ns %s %s%s %lldx%lldx%lld rel_err %.3g\n",
                      std::string(PrecisionName(p)).c_str(),
                      std::string(NsAlgorithmName(a)).c_str(),
                      polar ? "+polar" : "", static_cast<long long>(s.count),
                      static_cast<long long>(s.rows),
                      static_cast<long long>(s.cols), err);
          EXPECT_LT(err, Bound(p, o))
              << PrecisionName(p) << " " << NsAlgorithmName(a) << " " << s.count
              << "x" << s.rows << "x" << s.cols << " polar " << polar;
        }
      }
    }
  }
}

TEST(CudaNsTest, LlamaShapedSlicesMatchCpuWithinInputRounding) {
  struct Case {
    Shape shape;
    NsAlgorithm algorithm;
  };
  const Case cases[] = {{{2, 1024, 4096}, NsAlgorithm::kGram},
                        {{1, 4096, 1024}, NsAlgorithm::kGram},
                        {{2, 1024, 1024}, NsAlgorithm::kNs5},
                        {{1, 768, 2304}, NsAlgorithm::kNs5}};
  CpuKernels cpu;
  uint32_t seed = 50;
  for (const Case& c : cases) {
    const Shape& s = c.shape;
    const std::vector<float> in =
        GaussianMatrix(s.count * s.rows, s.cols, seed++);
    const std::vector<float> want = RunNs(&cpu, in, s, Options(c.algorithm));
    for (const Precision p : {Precision::kBf16, Precision::kFp16}) {
      auto gpu = Gpu(p);
      ASSERT_NE(gpu, nullptr);
      const double err =
          RelativeError(RunNs(gpu.get(), in, s, Options(c.algorithm)), want);
      std::printf("large %s %s %lldx%lldx%lld rel_err %.3g\n",
                  std::string(PrecisionName(p)).c_str(),
                  std::string(NsAlgorithmName(c.algorithm)).c_str(),
                  static_cast<long long>(s.count),
                  static_cast<long long>(s.rows),
                  static_cast<long long>(s.cols), err);
      EXPECT_LT(err, Bound(p, Options(c.algorithm)))
          << PrecisionName(p) << " " << s.rows << "x" << s.cols;
    }
  }
}

TEST(CudaNsTest, GraphsOnOffAndNewBuffersGiveTheSameResult) {
  const Shape s{3, 96, 320};
  const std::vector<float> in = GaussianMatrix(s.count * s.rows, s.cols, 9);
  for (const NsAlgorithm a : {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
    auto eager = Gpu(Precision::kBf16, /*graphs=*/false);
    auto graphed = Gpu(Precision::kBf16, /*graphs=*/true);
    ASSERT_NE(eager, nullptr);
    ASSERT_NE(graphed, nullptr);
    const std::vector<float> want = RunNs(eager.get(), in, s, Options(a));
    // Twice through the same graph, then in place (other buffers, a new
    // graph): every result equals the eager one up to the order of the
    // norm's atomic additions.
    EXPECT_LT(RelativeError(RunNs(graphed.get(), in, s, Options(a)), want),
              1e-6);
    EXPECT_LT(RelativeError(RunNs(graphed.get(), in, s, Options(a)), want),
              1e-6);
    std::vector<float> data = in;
    const MatrixStack stack{data.data(), s.count, s.rows, s.cols};
    ASSERT_TRUE(
        graphed->Orthogonalize(stack, stack, Options(a), kHostStream).ok());
    EXPECT_LT(RelativeError(data, want), 1e-6);
  }
}

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
