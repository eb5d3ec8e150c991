// Two GPUs, two workers over NCCL (one rank per GPU), two trainer
// processes, all real processes: a muonps-coordinator, muonps-worker
// --device=cuda:0 and cuda:1 with --gpu_transport=nccl, and trainer r (this
// binary run again, tests/gpu_two_gpus_trainer.h) on cuda:r lending its
// buffers to worker r by CUDA IPC. Here: 50 steps per layout x parameter
// dtype match the same kernels in one process (testing::ReferenceStep)
// within 5e-3 relative. gpu_two_gpus_failures.cc kills a worker and a
// trainer mid-step. Needs two GPUs (skips with fewer): tagged gpu +
// manual; bundled by deploy/device/bundle_gpu_step.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_device_ops.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/gpu_test_support.h"
#include "tests/gpu_two_gpus_fixture.h"
#include "tests/gpu_two_gpus_trainer.h"

namespace muonps {
namespace {

using testing::Matrices;
using testing::MatrixCase;
using testing::StepAttempt;
using testing::TwoGpusTest;
using testing::WaitForSuccess;

// The parameter: "<layout>" (fp32 buffers) or "<layout>/bf16"; with
// "/dedicated", one trainer (on cuda:0) and w1 a worker with no trainer
// (--dedicated, over the same NCCL communicator), which waits for each step
// on NCCL (NcclTransport::AwaitFrom) and owns matrices of its own.
class TwoGpusParityTest : public TwoGpusTest,
                          public ::testing::WithParamInterface<std::string> {};

TEST_P(TwoGpusParityTest, FiftyStepsOverNcclMatchTheSameKernelsInOneProcess) {
  layout_ = GetParam().substr(0, GetParam().find('/'));
  dtype_ = absl::StrContains(GetParam(), "/bf16") ? DType::kBFloat16
                                                  : DType::kFloat32;
  dedicated_ = absl::StrContains(GetParam(), "/dedicated");
  const int trainers = trainer_count();
  const scheduler::Layout layout = testing::LayoutOf(layout_);
  constexpr int kSteps = 50;
  // Retried, so that a spurious failure still leaves a parity figure; it
  // fails the case all the same (below).
  retry_for_ = absl::Seconds(60);
  ASSERT_NO_FATAL_FAILURE(StartJob(3000, {}, {}, kSteps - 1));
  for (auto& t : trainers_) {
    const absl::Status done = WaitForSuccess(*t, absl::Seconds(300));
    ASSERT_TRUE(done.ok()) << done;
  }
  for (int r = 0; r < trainers; ++r) {
    for (const StepAttempt& a : testing::ParseAttempts(trainers_[r]->Log())) {
      EXPECT_TRUE(a.ok) << "trainer " << r << " step " << a.step << ": "
                        << a.code << ": " << a.message;
    }
  }
  absl::StatusOr<std::map<std::string, kernels::NsAlgorithm>> algorithms =
      testing::ParseNsAlgorithms(trainers_[0]->Log());
  ASSERT_TRUE(algorithms.ok()) << algorithms.status();
  std::vector<std::vector<std::vector<float>>> got(trainers);
  for (int r = 0; r < trainers; ++r) {
    absl::StatusOr<std::vector<std::vector<float>>> read =
        testing::ReadTrainerParams(
            absl::StrCat(log_dir_, "/trainer", r, ".params"), layout, r,
            trainers);
    ASSERT_TRUE(read.ok()) << read.status();
    got[r] = *std::move(read);
  }

  // The same kernels in this process, on cuda:0, on the mean (unreduced)
  // or the one gradient as lent (rounded to bf16 for bf16 buffers).
  absl::StatusOr<std::unique_ptr<kernels::cuda::CudaKernels>> reference =
      kernels::cuda::CudaKernels::Create({.device = 0});
  ASSERT_TRUE(reference.ok()) << reference.status();
  cudaStream_t ref_stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&ref_stream), cudaSuccess);
  const std::unique_ptr<CUstream_st, decltype(&cudaStreamDestroy)>
      ref_stream_owner(ref_stream, &cudaStreamDestroy);
  absl::StatusOr<std::unique_ptr<kernels::cuda::CudaDeviceOps>> ops =
      kernels::cuda::CudaDeviceOps::Create(0, ref_stream);
  ASSERT_TRUE(ops.ok()) << ops.status();
  auto as_lent = [&](float v) {
    return dtype_ == DType::kFloat32 ? v : BFloat16ToFloat(FloatToBFloat16(v));
  };
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype_));
  double worst = 0;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixCase& c = Matrices()[m];
    const int64_t n = c.rows * c.cols * c.experts;
    float* grad = nullptr;
    float* momentum = nullptr;
    char* param = nullptr;
    ASSERT_EQ(cudaMalloc(&grad, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&momentum, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&param, n * width), cudaSuccess);
    ASSERT_EQ(cudaMemset(momentum, 0, n * 4), cudaSuccess);
    std::vector<float> init(n);
    for (int64_t i = 0; i < n; ++i) init[i] = testing::InitialParam(m, i);
    ASSERT_TRUE(testing::UploadAs(dtype_, init, param).ok());
    kernels::MuonHyperparameters h;
    h.lr = 0.02;
    h.weight_decay = 0.1;
    h.ns.algorithm = algorithms->at(c.name);
    const kernels::MatrixStack g{grad, c.experts, c.rows, c.cols};
    const kernels::MatrixStack mo{momentum, c.experts, c.rows, c.cols};
    std::vector<float> mean(n);
    for (int64_t step = 0; step < kSteps; ++step) {
      for (int64_t i = 0; i < n; ++i) {
        mean[i] = layout == scheduler::Layout::kUnreduced && trainers == 2
                      ? (as_lent(testing::TrainerGrad(layout, step, m, 0, i)) +
                         as_lent(testing::TrainerGrad(layout, step, m, 1, i))) *
                            0.5f
                      : as_lent(testing::TrainerGrad(layout, step, m, 0, i));
      }
      ASSERT_EQ(cudaMemcpy(grad, mean.data(), n * 4, cudaMemcpyHostToDevice),
                cudaSuccess);
      const absl::Status s =
          testing::ReferenceStep(**reference, **ops, g, mo, param, dtype_, h,
                                 reinterpret_cast<Stream>(ref_stream));
      ASSERT_TRUE(s.ok()) << s;
    }
    absl::StatusOr<std::vector<float>> wanted =
        testing::DownloadAs(dtype_, param, n);
    ASSERT_TRUE(wanted.ok()) << wanted.status();
    cudaFree(grad);
    cudaFree(momentum);
    cudaFree(param);
    for (int r = 0; r < trainers; ++r) {
      const auto [b, e] = testing::TrainerRows(c, layout, r, trainers);
      std::vector<float> expected;
      for (int64_t ex = 0; ex < c.experts; ++ex) {
        expected.insert(expected.end(),
                        wanted->begin() + ex * c.rows * c.cols + b * c.cols,
                        wanted->begin() + ex * c.rows * c.cols + e * c.cols);
      }
      const double err = testing::RelativeError(got[r][m], expected);
      worst = std::max(worst, err);
      EXPECT_LE(err, 5e-3) << c.name << " trainer " << r;
    }
  }
  std::printf(
      "{\"what\":\"gpu_two_gpus_parity\",\"layout\":\"%s\","
      "\"dtype\":\"%s\",\"dedicated_workers\":%d,\"steps\":%d,"
      "\"max_rel_err\":%g}\n",
      layout_.c_str(), std::string(DTypeName(dtype_)).c_str(),
      dedicated_ ? 1 : 0, kSteps, worst);
}

INSTANTIATE_TEST_SUITE_P(TwoGpus, TwoGpusParityTest,
                         ::testing::Values("replicated", "unreduced",
                                           "row_sharded", "replicated/bf16",
                                           "unreduced/bf16", "row_sharded/bf16",
                                           "replicated/dedicated",
                                           "row_sharded/bf16/dedicated"),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string name = i.param;
                           std::replace(name.begin(), name.end(), '/', '_');
                           return name;
                         });

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], muonps::testing::kTrainerFlag) == 0) {
    absl::StatusOr<muonps::testing::TrainerConfig> config =
        muonps::testing::ParseTrainerArgs(argc, argv);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
      return 2;
    }
    return muonps::testing::RunTrainer(*config);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
