// gpu_two_gpus_test's rolling restart (tests/gpu_two_gpus_fixture.h: two
// GPUs, workers over NCCL, trainer processes that retry a failed step as a
// training loop does): each worker in turn is stopped on purpose (SIGTERM:
// it drains, handing its momentum to the other over NCCL, then exits) and
// started again on its GPU and socket, during a 300-step run. No step
// fails for good, no momentum is reset, and both trainers' parameters
// equal the same kernels in one process bit for bit.
#include <sys/wait.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
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
using testing::UnixMs;
using testing::WaitForAttempt;
using testing::WaitForSuccess;

TEST_F(TwoGpusTest, ARollingRestartOfBothWorkersLosesNothing) {
  layout_ = "replicated";
  dtype_ = DType::kFloat32;
  constexpr int64_t kSteps = 300;
  retry_for_ = absl::Seconds(120);
  ASSERT_NO_FATAL_FAILURE(StartJob(3000, {}, {}, kSteps - 1));
  const int64_t restart_at[2] = {80, 180};
  int64_t out_ms[2] = {};
  for (int w = 0; w < 2; ++w) {
    // Trainer 0 got an answer to step restart_at[w]: stop worker w.
    absl::StatusOr<StepAttempt> reached =
        WaitForAttempt(*trainers_[0], restart_at[w], 0, absl::Seconds(240));
    ASSERT_TRUE(reached.ok()) << reached.status();
    const int64_t stopped_ms = UnixMs();
    workers_[w]->Signal(SIGTERM);
    absl::StatusOr<int> exited = workers_[w]->Wait(absl::Seconds(60));
    ASSERT_TRUE(exited.ok()) << "worker " << w << ": " << exited.status();
    EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0)
        << "worker " << w << ": " << *exited;
    EXPECT_TRUE(absl::StrContains(workers_[w]->Log(), "drained: step"))
        << "worker " << w << " left without handing its momentum over";
    out_ms[w] = UnixMs() - stopped_ms;
    ASSERT_NO_FATAL_FAILURE(
        StartWorker(w, {}, absl::StrCat("worker", w, ".restarted.log")));
  }
  for (auto& t : trainers_) {
    const absl::Status done = WaitForSuccess(*t, absl::Seconds(300));
    ASSERT_TRUE(done.ok()) << done;
  }
  int64_t failed = 0, resets = 0;
  for (int r = 0; r < testing::kTrainers; ++r) {
    std::map<int64_t, int> answered;
    for (const StepAttempt& a : testing::ParseAttempts(trainers_[r]->Log())) {
      if (!a.ok) {
        ++failed;
        continue;
      }
      ++answered[a.step];
      resets += a.momentum_reset;
    }
    for (int64_t step = 0; step < kSteps; ++step) {
      EXPECT_EQ(answered[step], 1) << "trainer " << r << " step " << step;
    }
  }
  EXPECT_EQ(resets, 0);
  absl::StatusOr<std::map<std::string, NsAlgorithm>> algorithms =
      testing::ParseNsAlgorithms(trainers_[0]->Log());
  ASSERT_TRUE(algorithms.ok()) << algorithms.status();
  absl::StatusOr<std::vector<std::vector<float>>> wanted =
      testing::ReferenceParams(
          dtype_, kSteps, *algorithms, testing::InitialParam,
          [&](int64_t step, size_t m, int64_t i) {
            return AsLent(dtype_,
                          testing::TrainerGrad(scheduler::Layout::kReplicated,
                                               step, m, 0, i));
          });
  ASSERT_TRUE(wanted.ok()) << wanted.status();
  double worst = 0;
  for (int r = 0; r < testing::kTrainers; ++r) {
    absl::StatusOr<std::vector<std::vector<float>>> got =
        testing::ReadTrainerParams(
            absl::StrCat(log_dir_, "/trainer", r, ".params"),
            scheduler::Layout::kReplicated, r, testing::kTrainers);
    ASSERT_TRUE(got.ok()) << got.status();
    for (size_t m = 0; m < Matrices().size(); ++m) {
      const MatrixCase& c = Matrices()[m];
      const auto [b, e] = testing::TrainerRows(
          c, scheduler::Layout::kReplicated, r, testing::kTrainers);
      worst = std::max(
          worst, testing::RelativeError(
                     (*got)[m], testing::ExpertRows((*wanted)[m], c, b, e)));
    }
  }
  EXPECT_EQ(worst, 0);
  std::printf(
      "{\"what\":\"gpu_two_gpus_rolling_restart\",\"layout\":\"replicated\","
      "\"dtype\":\"fp32\",\"steps\":%lld,\"restarted_at\":[%lld,%lld],"
      "\"drain_and_exit_ms\":[%lld,%lld],\"failed_attempts_retried\":%lld,"
      "\"momentum_reset\":%lld,\"max_rel_err\":%g}\n",
      static_cast<long long>(kSteps), static_cast<long long>(restart_at[0]),
      static_cast<long long>(restart_at[1]), static_cast<long long>(out_ms[0]),
      static_cast<long long>(out_ms[1]), static_cast<long long>(failed),
      static_cast<long long>(resets), worst);
}

}  // namespace
}  // namespace muonps
