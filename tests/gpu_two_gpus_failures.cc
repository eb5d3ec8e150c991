// gpu_two_gpus_test's failure cases (tests/gpu_two_gpus_fixture.h: two
// GPUs, workers over NCCL, trainer processes), unreduced bf16:
//  - a worker killed (kill -9) mid-step: the survivor aborts its NCCL
//    communicator, both trainers' steps fail in bounded time naming the
//    lost worker, and once the worker restarts on its GPU and socket the
//    job takes the next plan version, rebuilds the communicator and trains
//    on (momentum of the matrices whose owner changed restarts from zero,
//    logged);
//  - a trainer killed (kill -9) mid-step: the other trainer's step is
//    aborted everywhere naming the dead trainer's worker, both workers stay
//    healthy, and a new trainer process trains on with them.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu_two_gpus_fixture.h"
#include "tests/gpu_two_gpus_trainer.h"

namespace muonps {
namespace {

using testing::AllFinite;
using testing::ChildProcess;
using testing::kFailWithinMs;
using testing::kTrainers;
using testing::NcclPlanVersions;
using testing::StepAttempt;
using testing::TwoGpusTest;
using testing::UnixMs;
using testing::WaitForAttempt;
using testing::WaitForSuccess;
using testing::WaitUntilStopped;

// The step the cases break, and the last step they train to.
constexpr int64_t kFailingStep = 3;
constexpr int64_t kLastStep = kFailingStep + 5;

// Worker 1 stops itself (--test_pause_at) after the first transfer of
// step kFailingStep, so both trainers are inside that step when it is
// killed (kill -9).
TEST_F(TwoGpusTest,
       KilledWorkerFailsBothStepsNamingItAndTrainingGoesOnAfterRestart) {
  retry_for_ = absl::Seconds(150);
  ASSERT_NO_FATAL_FAILURE(StartJob(
      3000, {}, {absl::StrCat("--test_pause_at=transfer@", kFailingStep)},
      kLastStep));
  absl::StatusOr<std::string> paused =
      workers_[1]->WaitForLog("paused at transfer", absl::Seconds(120));
  ASSERT_TRUE(paused.ok()) << paused.status();
  ASSERT_TRUE(WaitUntilStopped(workers_[1]->pid(), absl::Seconds(10)).ok());
  int64_t version_before = -1;
  for (int r = 0; r < kTrainers; ++r) {
    for (const StepAttempt& a : testing::ParseAttempts(trainers_[r]->Log())) {
      ASSERT_LT(a.step, kFailingStep) << "trainer " << r << " answered";
      if (r == 0 && a.step == kFailingStep - 1) version_before = a.plan_version;
    }
  }
  ASSERT_GT(version_before, 0);
  const int64_t killed_ms = UnixMs();
  workers_[1]->Signal(SIGKILL);
  ASSERT_TRUE(workers_[1]->Wait(absl::Seconds(10)).ok());
  int64_t fail_ms[kTrainers] = {};
  for (int r = 0; r < kTrainers; ++r) {
    absl::StatusOr<StepAttempt> a = WaitForAttempt(
        *trainers_[r], kFailingStep, 0, absl::Milliseconds(2 * kFailWithinMs));
    ASSERT_TRUE(a.ok()) << a.status();
    fail_ms[r] = a->at_ms - killed_ms;
    std::printf("trainer %d: step %lld failed %lld ms after the kill: %s: %s\n",
                r, static_cast<long long>(kFailingStep),
                static_cast<long long>(fail_ms[r]), a->code.c_str(),
                a->message.c_str());
    EXPECT_FALSE(a->ok) << "trainer " << r;
    EXPECT_LT(fail_ms[r], kFailWithinMs) << "trainer " << r;
  }
  // Named: the survivor's error lists the plan's ranks by worker (NCCL
  // cannot tell which peer went silent); the dead worker's trainer names
  // its socket.
  const std::vector<StepAttempt> first0 =
      testing::ParseAttempts(trainers_[0]->Log());
  const std::vector<StepAttempt> first1 =
      testing::ParseAttempts(trainers_[1]->Log());
  for (const StepAttempt& a : first0) {
    if (a.step != kFailingStep || a.attempt != 0) continue;
    EXPECT_TRUE(absl::StrContains(a.message, "\"w1\"")) << a.message;
    EXPECT_TRUE(absl::StrContains(a.message, "\"w0\"")) << a.message;
  }
  for (const StepAttempt& a : first1) {
    if (a.step != kFailingStep || a.attempt != 0) continue;
    EXPECT_TRUE(absl::StrContains(a.message, Socket(1))) << a.message;
  }
  // The survivor freed its ranks' kernels by aborting the communicator.
  for (const char* line : {"aborting the communicator \\(ncclCommAbort\\)",
                           "communicator aborted in"}) {
    const absl::StatusOr<std::string> seen =
        workers_[0]->WaitForLog(line, absl::Seconds(30));
    EXPECT_TRUE(seen.ok()) << seen.status();
  }

  // Worker 1 again, on its GPU and socket: the job goes on.
  ASSERT_NO_FATAL_FAILURE(StartWorker(1, {}, "worker1.restarted.log"));
  for (auto& t : trainers_) {
    const absl::Status done = WaitForSuccess(*t, absl::Seconds(240));
    ASSERT_TRUE(done.ok()) << done;
  }
  int64_t version_after = -1, resets = 0;
  for (int r = 0; r < kTrainers; ++r) {
    std::map<int64_t, StepAttempt> answered;
    for (const StepAttempt& a : testing::ParseAttempts(trainers_[r]->Log())) {
      if (a.ok) answered[a.step] = a;
    }
    for (int64_t step = kFailingStep; step <= kLastStep; ++step) {
      ASSERT_EQ(answered.count(step), 1u) << "trainer " << r << " " << step;
      EXPECT_GT(answered[step].plan_version, version_before)
          << "trainer " << r << " step " << step;
      resets += answered[step].momentum_reset;
    }
    version_after = answered[kLastStep].plan_version;
    absl::StatusOr<std::vector<std::vector<float>>> params =
        testing::ReadTrainerParams(
            absl::StrCat(log_dir_, "/trainer", r, ".params"),
            testing::LayoutOf(layout_), r);
    ASSERT_TRUE(params.ok()) << params.status();
    EXPECT_TRUE(AllFinite(*params)) << "trainer " << r;
  }
  // A communicator of both ranks was built again for the new plan.
  const std::vector<int64_t> rebuilt =
      NcclPlanVersions(workers_[0]->Log(), "w0", 0, 2);
  EXPECT_TRUE(std::find(rebuilt.begin(), rebuilt.end(), version_after) !=
              rebuilt.end())
      << "w0 joined no 2-rank communicator for plan version " << version_after;
  const std::vector<int64_t> rejoined =
      NcclPlanVersions(workers_[1]->Log(), "w1", 1, 2);
  EXPECT_TRUE(std::find(rejoined.begin(), rejoined.end(), version_after) !=
              rejoined.end())
      << "the restarted w1 joined no communicator for plan version "
      << version_after;
  std::printf(
      "{\"what\":\"gpu_two_gpus_worker_killed\",\"fail_ms\":[%lld,%lld],"
      "\"plan_version_before\":%lld,\"plan_version_after\":%lld,"
      "\"momentum_reset\":%lld}\n",
      static_cast<long long>(fail_ms[0]), static_cast<long long>(fail_ms[1]),
      static_cast<long long>(version_before),
      static_cast<long long>(version_after), static_cast<long long>(resets));
}

// Worker 0 (rank 0, the decider) stops itself as step kFailingStep opens;
// trainer 1's call reaches worker 1, which sends its part of the agreement
// and waits; trainer 1 is killed (kill -9) and worker 0 let go. Worker 1
// sees its trainer's call cancelled before the vote and votes no: the step
// is aborted on every worker, nothing applied, and trainer 0's error names
// worker 1. The step does not complete.
TEST_F(TwoGpusTest, KilledTrainerAbortsTheOtherTrainersStepAndWorkersGoOn) {
  retry_for_ = absl::Seconds(150);
  // A lease far longer than worker 0's pause: no plan change meanwhile.
  ASSERT_NO_FATAL_FAILURE(
      StartJob(15000, {absl::StrCat("--test_pause_at=exchange@", kFailingStep)},
               {}, kLastStep));
  absl::StatusOr<std::string> paused =
      workers_[0]->WaitForLog("paused at exchange", absl::Seconds(120));
  ASSERT_TRUE(paused.ok()) << paused.status();
  ASSERT_TRUE(WaitUntilStopped(workers_[0]->pid(), absl::Seconds(10)).ok());
  absl::StatusOr<std::string> calling = trainers_[1]->WaitForLog(
      absl::StrCat("trainer=1 step=", kFailingStep, " attempt=0 calling"),
      absl::Seconds(30));
  ASSERT_TRUE(calling.ok()) << calling.status();
  // Its call reaches worker 1, which waits on rank 0 (well within the
  // worker's 10 s I/O timeout, all of this).
  absl::SleepFor(absl::Seconds(1));
  const int64_t killed_ms = UnixMs();
  trainers_[1]->Signal(SIGKILL);
  ASSERT_TRUE(trainers_[1]->Wait(absl::Seconds(10)).ok());
  // Worker 1's gRPC server sees the dead trainer's call cancelled.
  absl::SleepFor(absl::Seconds(2));
  workers_[0]->Signal(SIGCONT);
  absl::StatusOr<StepAttempt> a = WaitForAttempt(
      *trainers_[0], kFailingStep, 0, absl::Milliseconds(2 * kFailWithinMs));
  ASSERT_TRUE(a.ok()) << a.status();
  const int64_t fail_ms = a->at_ms - killed_ms;
  std::printf("trainer 0: step %lld answered %lld ms after the kill: %s: %s\n",
              static_cast<long long>(kFailingStep),
              static_cast<long long>(fail_ms), a->ok ? "ok" : a->code.c_str(),
              a->message.c_str());
  EXPECT_FALSE(a->ok) << "the step completed without trainer 1";
  EXPECT_EQ(a->code, "ABORTED") << a->message;
  EXPECT_TRUE(absl::StrContains(a->message, "worker \"w1\"")) << a->message;
  EXPECT_TRUE(absl::StrContains(a->message, "cancelled")) << a->message;
  EXPECT_LT(fail_ms, kFailWithinMs);
  // Both workers alive, answering, in the plan they had.
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(workers_[w]->running()) << "w" << w;
    absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(w);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->state(), "ready") << "w" << w;
    EXPECT_EQ(status->rank(), w);
  }
  const absl::StatusOr<std::string> released =
      workers_[1]->WaitForLog("released its buffers", absl::Seconds(30));
  EXPECT_TRUE(released.ok()) << released.status();

  // A new trainer 1 attaches to worker 1 and both train on.
  trainers_.push_back(
      StartTrainer(1, kFailingStep, kLastStep, "trainer1.replacement"));
  ASSERT_NE(trainers_.back(), nullptr);
  for (ChildProcess* t : {trainers_[0].get(), trainers_.back().get()}) {
    const absl::Status done = WaitForSuccess(*t, absl::Seconds(240));
    ASSERT_TRUE(done.ok()) << done;
  }
  for (const auto& [r, name] : {std::pair<int, const char*>{0, "trainer0"},
                                {1, "trainer1.replacement"}}) {
    absl::StatusOr<std::vector<std::vector<float>>> params =
        testing::ReadTrainerParams(absl::StrCat(log_dir_, "/", name, ".params"),
                                   testing::LayoutOf(layout_), r);
    ASSERT_TRUE(params.ok()) << params.status();
    EXPECT_TRUE(AllFinite(*params)) << name;
  }
  std::printf(
      "{\"what\":\"gpu_two_gpus_trainer_killed\",\"fail_ms\":%lld,"
      "\"code\":\"%s\"}\n",
      static_cast<long long>(fail_ms), a->code.c_str());
}

}  // namespace
}  // namespace muonps
