// Two GPUs, two workers over NCCL (one rank per GPU), two trainer
// processes, all real processes: a muonps-coordinator, muonps-worker
// --device=cuda:0 and cuda:1 with --gpu_transport=nccl, and trainer r (this
// binary run again, tests/gpu_two_gpus_trainer.h) on cuda:r lending its
// buffers to worker r by CUDA IPC. Here: 50 steps per layout x parameter
// dtype match the same kernels in one process (testing::ReferenceParams)
// within 5e-3 relative. gpu_two_gpus_failures.cc kills a worker and a
// trainer mid-step; gpu_two_gpus_rolling.cc restarts both workers, one at a
// time, during training. On a machine of one GPU both workers and trainers
// share cuda:0, each worker a NCCL host of its own (NCCL's network
// transport on loopback: the same calls, slower links). Needs a GPU: tagged
// gpu + manual; bundled by deploy/device/bundle_gpu_step.sh.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "tests/gpu_test_support.h"
#include "tests/gpu_two_gpus_fixture.h"
#include "tests/gpu_two_gpus_trainer.h"

namespace muonps {
namespace {

using testing::AsLent;
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
  absl::StatusOr<std::map<std::string, NsAlgorithm>> algorithms =
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
  const bool mean = layout == scheduler::Layout::kUnreduced && trainers == 2;
  absl::StatusOr<std::vector<std::vector<float>>> wanted =
      testing::ReferenceParams(
          dtype_, kSteps, *algorithms, testing::InitialParam,
          [&](int64_t step, size_t m, int64_t i) {
            auto lent = [&](int t) {
              return AsLent(dtype_,
                            testing::TrainerGrad(layout, step, m, t, i));
            };
            return mean ? (lent(0) + lent(1)) * 0.5f : lent(0);
          });
  ASSERT_TRUE(wanted.ok()) << wanted.status();
  double worst = 0;
  for (size_t m = 0; m < Matrices().size(); ++m) {
    const MatrixCase& c = Matrices()[m];
    for (int r = 0; r < trainers; ++r) {
      const auto [b, e] = testing::TrainerRows(c, layout, r, trainers);
      const double err = testing::RelativeError(
          got[r][m], testing::ExpertRows((*wanted)[m], c, b, e));
      worst = std::max(worst, err);
      // Bit for bit: every rank applies the owner's update as it left the
      // owner (rounded to the precision Newton-Schulz ran in), as the
      // single process applies its own.
      EXPECT_EQ(err, 0) << c.name << " trainer " << r;
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
