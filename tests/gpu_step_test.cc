// The GPU data path on one GPU, with real processes: a muonps-coordinator
// and a muonps-worker --device cuda:0 as children, and a trainer (this
// process, muonps::Client with ClientOptions.device cuda:0) lending CUDA
// buffers by IPC: sub-blocks of one cudaMalloc, as PyTorch's caching
// allocator hands them out. Per case (layout x NS precision): 50 steps of
// fixed gradients; the trainer's parameters, as the worker updated them in
// place, match a single-process run of the same CUDA kernels within the
// CUDA backend's tolerances; and the owner's momentum matches too. Also: a
// non-finite gradient is rejected with nothing written, a killed worker
// fails the trainer's step with an error instead of a hang, and a trainer
// killed mid-step has its worker release the IPC mappings (its GPU memory
// comes back), and gradients marked ready one matrix at a time
// (Client::GradientReady) step as the step's own stream orders them. Two
// workers on one GPU: tests/gpu_two_workers_test.cc.
//
// Needs a GPU: tagged gpu + manual; deploy/device/run_gpu_step_suite.sh
// runs it on the GPU machine (MUONPS_BIN_DIR names the bundled binaries).
#include <cuda_runtime.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/device.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_device_ops.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/precision.h"
#include "kernels/muon_kernels.h"
#include "newton_schulz/options.h"
#include "tests/client_options.h"
#include "tests/gpu_test_support.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using testing::GradValue;
using testing::Matrices;
using testing::MatrixCase;
using testing::RelativeError;
constexpr absl::Duration kStartTimeout = testing::kGpuStartTimeout;

using testing::BinaryPath;
using testing::ChildProcess;
using testing::NewTempDir;

struct GpuCase {
  std::string layout;
  std::string precision;       // of Newton-Schulz's GEMM inputs
  std::string dtype = "fp32";  // of the lent gradients and parameters
};

class GpuStepTest : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no GPU";
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    log_dir_ = NewTempDir("gpu_step");
    char socket_dir[] = "/tmp/muonps-gs-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir), nullptr);
    socket_ = absl::StrCat(socket_dir, "/w0.sock");
    absl::StatusOr<testing::RunningCoordinator> c =
        testing::StartCoordinator(log_dir_ + "/coordinator.log", kStartTimeout);
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = std::move(c->process);
    address_ = c->address;
    ASSERT_NO_FATAL_FAILURE(StartWorker("worker.log"));
  }

  // The worker "w0" on cuda:0, logging into `log` under the log folder.
  void StartWorker(const std::string& log) {
    absl::StatusOr<std::unique_ptr<ChildProcess>> w = ChildProcess::Start(
        {BinaryPath("server/worker/muonps-worker"), "--coordinator=" + address_,
         "--job=gpu", "--worker_id=w0", "--socket=" + socket_,
         "--metrics_port=-1", "--device=cuda:0",
         "--precision=" + GetParam().precision, "--io_timeout_ms=10000"},
        log_dir_ + "/" + log);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = *std::move(w);
    ASSERT_TRUE(worker_->WaitForLog("listening on unix:", kStartTimeout).ok())
        << worker_->Log();
  }

  void TearDown() override {
    if (HasFailure()) {
      if (coordinator_) std::cerr << "== coordinator\n" << coordinator_->Log();
      if (worker_) std::cerr << "== worker\n" << worker_->Log();
    }
    client_.reset();
    if (device_block_ != nullptr) cudaFree(device_block_);
    worker_.reset();
    coordinator_.reset();
  }

  TensorLayout Layout() const {
    const std::string& l = GetParam().layout;
    return l == "unreduced"     ? TensorLayout::kUnreduced
           : l == "row_sharded" ? TensorLayout::kRowSharded
                                : TensorLayout::kReplicated;
  }

  DType Dtype() const {
    return GetParam().dtype == "bf16" ? DType::kBFloat16 : DType::kFloat32;
  }
  int64_t Width() const { return static_cast<int64_t>(DTypeSize(Dtype())); }

  void Upload(const std::vector<float>& values, char* at) {
    const absl::Status s = testing::UploadAs(Dtype(), values, at);
    ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<float> Download(const char* at, int64_t count) {
    absl::StatusOr<std::vector<float>> out =
        testing::DownloadAs(Dtype(), at, count);
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? *std::move(out) : std::vector<float>(count);
  }
  char* GradAt(size_t m) { return device_block_ + offsets_[m] * Width(); }
  char* ParamAt(size_t m) {
    const MatrixCase& c = Matrices()[m];
    const int64_t n = c.rows * c.cols * c.experts;
    return GradAt(m) + (n + 127) / 128 * 128 * Width();
  }

  // StartTrainer with lr 0.02 and weight decay 0.1 (`muon`), and the
  // Newton-Schulz algorithm the plan chose for each matrix.
  void StartWithAlgorithms(kernels::MuonHyperparameters* muon,
                           std::map<std::string, NsAlgorithm>* algorithms) {
    muon->lr = 0.02;
    muon->weight_decay = 0.1;
    ASSERT_NO_FATAL_FAILURE(StartTrainer(*muon));
    absl::StatusOr<std::map<std::string, NsAlgorithm>> chosen =
        testing::NsAlgorithmsOf(client_->NsAlgorithms());
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    *algorithms = *std::move(chosen);
  }

  // Declares the matrices, lends sub-blocks of one allocation, starts
  // (with momentum checkpoints into `checkpoint_dir` every step, if set).
  void StartTrainer(const kernels::MuonHyperparameters& muon,
                    const std::string& checkpoint_dir = "") {
    absl::StatusOr<std::unique_ptr<Client>> created =
        Client::Create({.coordinator = address_,
                        .job = "gpu",
                        .worker_socket = socket_,
                        .trainer_rank = 0,
                        .trainer_count = 1,
                        .device = "cuda:0"});
    ASSERT_TRUE(created.ok()) << created.status();
    client_ = *std::move(created);
    int64_t total = 0;
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      ASSERT_TRUE(client_
                      ->AddMatrix(c.name, c.rows, c.cols,
                                  {.layout = Layout(),
                                   .layer = static_cast<int32_t>(m),
                                   .experts = c.experts})
                      .ok());
      // 256-byte aligned sub-blocks, grad then param.
      const int64_t n = c.rows * c.cols * c.experts;
      offsets_.push_back(total);
      total += 2 * ((n + 127) / 128 * 128);
    }
    ASSERT_EQ(cudaMalloc(&device_block_, total * Width()), cudaSuccess);
    params_.resize(Matrices().size());
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      const int64_t n = c.rows * c.cols * c.experts;
      std::vector<float>& p = params_[m];
      p.resize(n);
      std::mt19937 rng(11 + m);
      std::normal_distribution<float> normal(0.0f, 0.02f);
      for (float& v : p) v = normal(rng);
      ASSERT_NO_FATAL_FAILURE(Upload(p, ParamAt(m)));
      p = Download(ParamAt(m), n);  // as lent (bf16: rounded)
      ASSERT_TRUE(client_
                      ->LendCuda(c.name, GradAt(m), ParamAt(m),
                                 testing::ClientDType(Dtype()))
                      .ok());
    }
    if (!checkpoint_dir.empty()) {
      ASSERT_TRUE(client_->SetCheckpointing(checkpoint_dir, 1).ok());
    }
    const absl::Status started =
        client_->Start(testing::ClientMuon(muon), AdamWOptions());
    ASSERT_TRUE(started.ok()) << started;
  }

  void WriteGradients(int64_t step, int poison_matrix = -1) {
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      std::vector<float> g(c.rows * c.cols * c.experts);
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = GradValue(step, static_cast<int>(m), static_cast<int64_t>(i));
      }
      if (static_cast<int>(m) == poison_matrix) g[g.size() / 2] = NAN;
      ASSERT_NO_FATAL_FAILURE(Upload(g, GradAt(m)));
    }
  }

  std::vector<float> DeviceParams(size_t m) {
    const MatrixCase& c = Matrices()[m];
    return Download(ParamAt(m), c.rows * c.cols * c.experts);
  }

  std::string log_dir_, socket_, address_;
  std::unique_ptr<ChildProcess> coordinator_, worker_;
  std::unique_ptr<Client> client_;
  char* device_block_ = nullptr;
  std::vector<int64_t> offsets_;            // in elements of the lent dtype
  std::vector<std::vector<float>> params_;  // initial values
};

TEST_P(GpuStepTest, FiftyStepsMatchTheSameKernelsInOneProcess) {
  kernels::MuonHyperparameters muon;
  std::map<std::string, NsAlgorithm> algorithms;
  ASSERT_NO_FATAL_FAILURE(StartWithAlgorithms(&muon, &algorithms));

  // The reference: the same CUDA kernels and precision in this process.
  absl::StatusOr<kernels::cuda::Precision> precision =
      kernels::cuda::ParsePrecision(GetParam().precision);
  ASSERT_TRUE(precision.ok());
  absl::StatusOr<std::unique_ptr<kernels::cuda::CudaKernels>> reference =
      kernels::cuda::CudaKernels::Create(
          {.device = 0, .precision = *precision});
  ASSERT_TRUE(reference.ok()) << reference.status();
  // Blocking: ordered with this test's cudaMemcpy calls (legacy stream).
  cudaStream_t ref_stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&ref_stream), cudaSuccess);
  const std::unique_ptr<CUstream_st, decltype(&cudaStreamDestroy)>
      ref_stream_owner(ref_stream, &cudaStreamDestroy);
  // bf16 parameters: the reference applies the update with the worker's
  // own DeviceOps (fp32 arithmetic, one rounding to bf16).
  absl::StatusOr<std::unique_ptr<kernels::cuda::CudaDeviceOps>> ops =
      kernels::cuda::CudaDeviceOps::Create(0, ref_stream);
  ASSERT_TRUE(ops.ok()) << ops.status();
  struct RefMatrix {
    float *grad, *momentum;
    char* param;  // of the lent dtype
  };
  std::vector<RefMatrix> ref;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const int64_t n =
        Matrices()[m].rows * Matrices()[m].cols * Matrices()[m].experts;
    RefMatrix r{};
    ASSERT_EQ(cudaMalloc(&r.grad, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&r.momentum, n * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&r.param, n * Width()), cudaSuccess);
    ASSERT_EQ(cudaMemset(r.momentum, 0, n * 4), cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(Upload(params_[m], r.param));
    ref.push_back(r);
  }
  constexpr int kSteps = 50;
  std::vector<double> return_ms;
  for (int64_t step = 0; step < kSteps; ++step) {
    ASSERT_NO_FATAL_FAILURE(WriteGradients(step));
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      const std::vector<float> g =
          Download(GradAt(m), c.rows * c.cols * c.experts);  // widened
      ASSERT_EQ(cudaMemcpy(ref[m].grad, g.data(), g.size() * 4,
                           cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    // Odd steps return once enqueued; the trainer's next copies (on the
    // legacy default stream) wait for the worker's updates on the device.
    const bool async = step % 2 == 1;
    const absl::Time call = absl::Now();
    absl::StatusOr<StepResult> result = client_->Step(step, {.async = async});
    if (async)
      return_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - call));
    ASSERT_TRUE(result.ok()) << "step " << step << ": " << result.status();
    ASSERT_EQ(result->pending, async);
    if (async) {
      result = client_->Wait();
      ASSERT_TRUE(result.ok()) << "step " << step << ": " << result.status();
    }
    ASSERT_FALSE(result->already_applied);
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      kernels::MuonHyperparameters h = muon;
      h.ns.algorithm = algorithms.at(c.name);
      kernels::MuonStack stack;
      stack.names = {c.name};
      stack.grad = {ref[m].grad, c.experts, c.rows, c.cols};
      stack.momentum = {ref[m].momentum, c.experts, c.rows, c.cols};
      const absl::Status s = testing::ReferenceStep(
          **reference, **ops, stack.grad, stack.momentum, ref[m].param, Dtype(),
          h, reinterpret_cast<Stream>(ref_stream));
      ASSERT_TRUE(s.ok()) << s;
    }
  }
  // fp32 NS: rounding only; with bf16 parameters, the odd element whose
  // update lands the other side of a rounding boundary sits one bf16 ulp
  // (2^-8 relative) away: 3e-4 after 50 steps on an H100. 16-bit NS: the
  // backend's bf16/fp16 spread.
  const double tolerance = GetParam().precision != "fp32" ? 5e-3
                           : Dtype() == DType::kFloat32   ? 1e-5
                                                          : 1e-3;
  double worst = 0;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixCase& c = Matrices()[m];
    const int64_t n = c.rows * c.cols * c.experts;
    const std::vector<float> want = Download(ref[m].param, n);
    const double err = RelativeError(DeviceParams(m), want);
    worst = std::max(worst, err);
    EXPECT_LE(err, tolerance) << c.name;
    // The owner's momentum (one worker owns everything here).
    for (int64_t e = 0; e < c.experts; ++e) {
      absl::StatusOr<std::vector<float>> got =
          client_->OwnedMomentum(c.name, e);
      ASSERT_TRUE(got.ok()) << got.status();
      std::vector<float> expected(c.rows * c.cols);
      ASSERT_EQ(
          cudaMemcpy(expected.data(), ref[m].momentum + e * c.rows * c.cols,
                     expected.size() * 4, cudaMemcpyDeviceToHost),
          cudaSuccess);
      EXPECT_LE(RelativeError(*got, expected), 1e-6)
          << c.name << "[" << e << "]";
    }
    cudaFree(ref[m].grad);
    cudaFree(ref[m].momentum);
    cudaFree(ref[m].param);
  }
  std::printf(
      "{\"what\":\"gpu_step_parity\",\"layout\":\"%s\",\"precision\":"
      "\"%s\",\"dtype\":\"%s\",\"steps\":%d,\"max_rel_err\":%g}\n",
      GetParam().layout.c_str(), GetParam().precision.c_str(),
      GetParam().dtype.c_str(), kSteps, worst);
  // An async Step returns once the step is enqueued: no host wait for the
  // worker on the trainer's path (bench/step_gpu measures 0.12-0.16 ms at
  // 1.74 B parameters). The median, so that one scheduling hiccup of the
  // host does not decide it.
  std::sort(return_ms.begin(), return_ms.end());
  ASSERT_FALSE(return_ms.empty());
  const double median = return_ms[return_ms.size() / 2];
  std::printf("{\"what\":\"gpu_step_return\",\"median_ms\":%g}\n", median);
  EXPECT_LT(median, 1.0) << "Step(async) blocked the trainer's thread";
}

// Gradients marked ready one matrix at a time, as a trainer's backward
// hooks do (Client::GradientReady on the stream that wrote each): every
// other matrix is left to the step's own stream, one is marked, written
// again and marked again (a gradient clipped after its hook), and each
// step's gradients are written and marked while the previous async step
// may still be unanswered. The parameters match the same kernels in one
// process, and no step hangs on a mark.
TEST_P(GpuStepTest, GradientsMarkedReadyOneByOneMatchTheSameKernels) {
  if (GetParam().layout != "replicated" || GetParam().precision != "bf16") {
    GTEST_SKIP() << "one case per dtype is enough";
  }
  kernels::MuonHyperparameters muon;
  std::map<std::string, NsAlgorithm> algorithms;
  ASSERT_NO_FATAL_FAILURE(StartWithAlgorithms(&muon, &algorithms));
  // Non-blocking: nothing on the legacy stream orders the trainer's work.
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  const std::unique_ptr<CUstream_st, decltype(&cudaStreamDestroy)> stream_owner(
      stream, &cudaStreamDestroy);
  // Every step's gradients (and a wrong one for matrix 0) staged on the
  // device first, so that the loop only enqueues copies on `stream`.
  constexpr int kSteps = 10;
  std::vector<int64_t> staged(Matrices().size());
  int64_t per_step = 0;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixCase& c = Matrices()[m];
    staged[m] = per_step;
    per_step += (c.rows * c.cols * c.experts + 127) / 128 * 128;
  }
  char* staging = nullptr;
  ASSERT_EQ(cudaMalloc(&staging, (kSteps + 1) * per_step * Width()),
            cudaSuccess);
  const std::unique_ptr<char, decltype(&cudaFree)> staging_owner(staging,
                                                                 &cudaFree);
  const auto staged_at = [&](int64_t step, size_t m) {
    return staging + (step * per_step + staged[m]) * Width();
  };
  for (int64_t step = 0; step < kSteps; ++step) {
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      std::vector<float> g(c.rows * c.cols * c.experts);
      for (size_t i = 0; i < g.size(); ++i) {
        g[i] = GradValue(step, static_cast<int>(m), static_cast<int64_t>(i));
      }
      ASSERT_NO_FATAL_FAILURE(Upload(g, staged_at(step, m)));
    }
  }
  const MatrixCase& first = Matrices()[0];
  const int64_t first_n = first.rows * first.cols * first.experts;
  ASSERT_NO_FATAL_FAILURE(
      Upload(std::vector<float>(first_n, 1e3f), staged_at(kSteps, 0)));
  for (int64_t step = 0; step < kSteps; ++step) {
    // Matrix 0: a wrong gradient marked ready, then overwritten and marked
    // again; the step must read the last mark's.
    ASSERT_EQ(
        cudaMemcpyAsync(GradAt(0), staged_at(kSteps, 0), first_n * Width(),
                        cudaMemcpyDeviceToDevice, stream),
        cudaSuccess);
    absl::Status marked = client_->GradientReady(first.name, stream);
    ASSERT_TRUE(marked.ok()) << marked;
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      ASSERT_EQ(cudaMemcpyAsync(GradAt(m), staged_at(step, m),
                                c.rows * c.cols * c.experts * Width(),
                                cudaMemcpyDeviceToDevice, stream),
                cudaSuccess);
      if (m % 2 == 0) {
        marked = client_->GradientReady(c.name, stream);
        ASSERT_TRUE(marked.ok()) << "step " << step << ": " << marked;
      }
    }
    absl::StatusOr<StepResult> result =
        client_->Step(step, {.stream = stream, .async = true});
    ASSERT_TRUE(result.ok()) << "step " << step << ": " << result.status();
    ASSERT_TRUE(result->pending);
  }
  absl::StatusOr<StepResult> last = client_->Wait();
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  absl::StatusOr<std::vector<std::vector<float>>> wanted =
      testing::ReferenceParams(
          Dtype(), kSteps, algorithms,
          [&](size_t m, int64_t i) { return params_[m][i]; },
          [&](int64_t step, size_t m, int64_t i) {
            return testing::AsLent(Dtype(),
                                   GradValue(step, static_cast<int>(m), i));
          });
  ASSERT_TRUE(wanted.ok()) << wanted.status();
  double worst = 0;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const double err = RelativeError(DeviceParams(m), (*wanted)[m]);
    worst = std::max(worst, err);
    EXPECT_LE(err, 5e-3) << Matrices()[m].name;
  }
  std::printf(
      "{\"what\":\"gpu_gradient_ready_parity\",\"dtype\":\"%s\","
      "\"steps\":%d,\"max_rel_err\":%g}\n",
      GetParam().dtype.c_str(), kSteps, worst);
}

TEST_P(GpuStepTest, NonFiniteGradientIsRejectedWithNothingWritten) {
  if (GetParam().layout != "replicated" || GetParam().precision != "bf16") {
    GTEST_SKIP() << "one case is enough";
  }
  ASSERT_NO_FATAL_FAILURE(StartTrainer({}));
  ASSERT_NO_FATAL_FAILURE(WriteGradients(0));
  ASSERT_TRUE(client_->Step(0).ok());
  std::vector<std::vector<float>> before;
  for (size_t m = 0; m < Matrices().size(); ++m)
    before.push_back(DeviceParams(m));
  ASSERT_NO_FATAL_FAILURE(WriteGradients(1, /*poison_matrix=*/3));
  absl::StatusOr<StepResult> result = client_->Step(1);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(result.status().message().find("mlp.down"), std::string::npos)
      << result.status();
  EXPECT_NE(result.status().message().find("NaN"), std::string::npos);
  for (size_t m = 0; m < Matrices().size(); ++m) {
    EXPECT_EQ(DeviceParams(m), before[m]) << Matrices()[m].name;
  }
  // And the job goes on.
  ASSERT_NO_FATAL_FAILURE(WriteGradients(1));
  absl::StatusOr<StepResult> retry = client_->Step(1);
  EXPECT_TRUE(retry.ok()) << retry.status();
}

TEST_P(GpuStepTest, KilledWorkerFailsTheStepInsteadOfHanging) {
  if (GetParam().layout != "replicated" || GetParam().precision != "bf16" ||
      GetParam().dtype != "fp32") {
    GTEST_SKIP() << "one case is enough";
  }
  ASSERT_NO_FATAL_FAILURE(StartTrainer({}));
  ASSERT_NO_FATAL_FAILURE(WriteGradients(0));
  ASSERT_TRUE(client_->Step(0).ok());
  worker_->Signal(SIGKILL);
  ASSERT_TRUE(worker_->Wait(absl::Seconds(10)).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<StepResult> result = client_->Step(1);
  EXPECT_FALSE(result.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  EXPECT_NE(result.status().message().find("Step"), std::string::npos)
      << result.status();
  // The trainer's memory is intact and usable after the worker died.
  std::vector<float> p = DeviceParams(0);
  EXPECT_EQ(p.size(), static_cast<size_t>(256 * 256));
}

// Checkpoints on a GPU: each step's new momentum is copied from the
// device and written before the step's vote; a worker killed with SIGKILL
// and started again restores it into device memory from the checkpoint of
// the last step, bit for bit, and the trainer goes on with the next step.
TEST_P(GpuStepTest, CheckpointsLeaveTheDeviceAndComeBackAfterAKill) {
  if (GetParam().layout != "replicated" || GetParam().precision != "bf16" ||
      GetParam().dtype != "fp32") {
    GTEST_SKIP() << "one case is enough";
  }
  ASSERT_NO_FATAL_FAILURE(StartTrainer({}, log_dir_ + "/checkpoints"));
  for (int64_t step = 0; step < 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(WriteGradients(step));
    absl::StatusOr<StepResult> result = client_->Step(step);
    ASSERT_TRUE(result.ok()) << "step " << step << ": " << result.status();
  }
  std::map<std::string, std::vector<float>> before;
  for (const MatrixCase& c : Matrices()) {
    for (int64_t e = 0; e < c.experts; ++e) {
      absl::StatusOr<std::vector<float>> m = client_->OwnedMomentum(c.name, e);
      ASSERT_TRUE(m.ok()) << m.status();
      before[absl::StrCat(c.name, "[", e, "]")] = *std::move(m);
    }
  }
  worker_->Signal(SIGKILL);
  ASSERT_TRUE(worker_->Wait(absl::Seconds(10)).ok());
  ASSERT_NO_FATAL_FAILURE(StartWorker("worker-restarted.log"));
  // The restarted worker restores once its plan arrives.
  ASSERT_TRUE(
      worker_->WaitForLog("restored the momentum of", kStartTimeout).ok())
      << worker_->Log();
  for (const MatrixCase& c : Matrices()) {
    for (int64_t e = 0; e < c.experts; ++e) {
      absl::StatusOr<std::vector<float>> m = client_->OwnedMomentum(c.name, e);
      ASSERT_TRUE(m.ok()) << c.name << ": " << m.status();
      EXPECT_EQ(*m, before[absl::StrCat(c.name, "[", e, "]")])
          << c.name << "[" << e << "]";
    }
  }
  // A retry of step 2, as after an answer lost with the worker: the
  // restarted worker reads the trainer's step record (device memory lent
  // by CUDA IPC) and answers already_applied, changing nothing. Retried
  // while the error is transient (the restarted worker joins once the
  // killed instance's lease ends), as a training loop does.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  absl::StatusOr<StepResult> retry = client_->Step(2);
  while (absl::IsUnavailable(retry.status()) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(200));
    retry = client_->Step(2);
  }
  ASSERT_TRUE(retry.ok()) << retry.status() << "\n" << worker_->Log();
  EXPECT_TRUE(retry->already_applied);
  EXPECT_TRUE(absl::StrContains(worker_->Log(),
                                "step record says the parameters hold step 2"))
      << worker_->Log();
  ASSERT_NO_FATAL_FAILURE(WriteGradients(3));
  absl::StatusOr<StepResult> next = client_->Step(3);
  while (absl::IsUnavailable(next.status()) && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(200));
    next = client_->Step(3);
  }
  ASSERT_TRUE(next.ok()) << next.status() << "\n" << worker_->Log();
  EXPECT_FALSE(next->already_applied);
  EXPECT_EQ(next->momentum_reset, 0);
}

// The child mode of this binary: a trainer process lending a 1 GiB
// allocation's sub-blocks and stepping until it is killed.
int RunChildTrainer(const std::string& address, const std::string& socket) {
  absl::StatusOr<std::unique_ptr<Client>> created =
      Client::Create({.coordinator = address,
                      .job = "gpu",
                      .worker_socket = socket,
                      .device = "cuda:0"});
  if (!created.ok()) return 2;
  Client& client = **created;
  float* block = nullptr;
  if (cudaMalloc(&block, size_t{1} << 30) != cudaSuccess) return 3;
  cudaMemset(block, 0, size_t{1} << 30);
  constexpr int64_t kDim = 2048;
  if (!client.AddMatrix("m", kDim, kDim).ok()) return 4;
  if (!client.LendCuda("m", block, block + kDim * kDim).ok()) return 5;
  if (!client.Start({}, {}).ok()) return 6;
  for (int64_t step = 0;; ++step) {
    if (!client.Step(step, {.async = true}).ok()) return 7;
    if (!client.Wait().ok()) return 8;
    std::printf("stepped %lld\n", static_cast<long long>(step));
    std::fflush(stdout);
  }
}

TEST_P(GpuStepTest, KilledTrainerMidStepHasItsMappingsReleased) {
  if (GetParam().layout != "replicated" || GetParam().precision != "bf16" ||
      GetParam().dtype != "fp32") {
    GTEST_SKIP() << "one case is enough";
  }
  size_t total = 0;
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Start(
      {"/proc/self/exe", "--trainer_child=" + address_ + "," + socket_},
      log_dir_ + "/trainer.log");
  ASSERT_TRUE(child.ok()) << child.status();
  ASSERT_TRUE((*child)->WaitForLog("stepped 20", kStartTimeout).ok())
      << (*child)->Log() << worker_->Log();
  size_t free_alive = 0;  // the trainer's context and 1 GiB are held
  ASSERT_EQ(cudaMemGetInfo(&free_alive, &total), cudaSuccess);
  (*child)->Signal(SIGKILL);  // steps run back to back: mid-step
  ASSERT_TRUE((*child)->Wait(absl::Seconds(10)).ok());
  ASSERT_TRUE(
      worker_->WaitForLog("released its buffers", absl::Seconds(20)).ok())
      << worker_->Log();
  // The trainer's 1 GiB allocation (and its context) is freed once no
  // mapping holds it.
  size_t free_after = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  do {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  } while (free_after < free_alive + (size_t{1} << 30) &&
           absl::Now() < deadline);
  EXPECT_GE(free_after, free_alive + (size_t{1} << 30))
      << "GPU memory returned after the trainer died: "
      << (static_cast<int64_t>(free_after) - static_cast<int64_t>(free_alive)) /
             (1 << 20)
      << " MiB";
  std::printf(
      "{\"what\":\"killed_trainer_memory_returned_mib\",\"mib\":%lld}\n",
      static_cast<long long>((static_cast<int64_t>(free_after) -
                              static_cast<int64_t>(free_alive)) >>
                             20));
  // The worker goes on: a new trainer of the job attaches and steps.
  absl::StatusOr<std::unique_ptr<Client>> created =
      Client::Create({.coordinator = address_,
                      .job = "gpu",
                      .worker_socket = socket_,
                      .device = "cuda:0"});
  ASSERT_TRUE(created.ok()) << created.status();
  client_ = *std::move(created);
  constexpr int64_t kDim = 2048;
  constexpr int64_t kBytes = kDim * kDim * sizeof(float);
  ASSERT_EQ(cudaMalloc(&device_block_, 2 * kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(device_block_, 0, 2 * kBytes), cudaSuccess);
  ASSERT_TRUE(client_->AddMatrix("m", kDim, kDim).ok());
  ASSERT_TRUE(
      client_->LendCuda("m", device_block_, device_block_ + kBytes).ok());
  const absl::Status started = client_->Start({}, {});
  ASSERT_TRUE(started.ok()) << started;
  absl::StatusOr<StepResult> next = client_->Step(1000000);
  EXPECT_TRUE(next.ok()) << next.status();
}

std::vector<GpuCase> Cases() {
  std::vector<GpuCase> out;
  for (const char* precision : {"fp32", "bf16"}) {
    for (const char* layout : {"replicated", "unreduced", "row_sharded"}) {
      out.push_back({layout, precision});
    }
  }
  // bf16 parameters: every layout with the default bf16 NS, and fp32 NS
  // once (where only the parameter's rounding differs).
  for (const char* layout : {"replicated", "unreduced", "row_sharded"}) {
    out.push_back({layout, "bf16", "bf16"});
  }
  out.push_back({"replicated", "fp32", "bf16"});
  // fp16 Newton-Schulz: its updates travel and wait in fp16.
  out.push_back({"replicated", "fp16"});
  out.push_back({"row_sharded", "fp16", "bf16"});
  return out;
}

INSTANTIATE_TEST_SUITE_P(OneGpu, GpuStepTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& info) {
                           return info.param.layout + "_" +
                                  info.param.precision + "_" + info.param.dtype;
                         });

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string flag = "--trainer_child=";
    if (arg.rfind(flag, 0) == 0) {
      const std::string value = arg.substr(flag.size());
      const size_t comma = value.find(',');
      return muonps::RunChildTrainer(value.substr(0, comma),
                                     value.substr(comma + 1));
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
