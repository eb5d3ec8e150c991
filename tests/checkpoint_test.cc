// Momentum checkpoints through the real service (coordinator and worker
// processes, trainers in the test process, files on disk): workers write
// what they own every N steps and when asked, with manifests and checksums
// that verify; a worker killed with SIGKILL and started again restores its
// momentum from its checkpoint, equal to the momentum a replay of the same
// steps gives, and the job resumes from there as if never interrupted; and
// momentum far above gRPC's 4 MiB message limit moves in chunks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/worker/checkpoint_store.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace testing {
namespace {

constexpr double kTolerance = 1e-5;

using Outcomes = std::vector<std::optional<StepOutcome>>;

void ExpectAllStepped(const Outcomes& outcomes, int64_t step) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    ASSERT_TRUE(outcomes[r].has_value()) << "trainer " << r;
    ASSERT_TRUE(outcomes[r]->result.ok())
        << "step " << step << " trainer " << r << ": "
        << outcomes[r]->result.status();
  }
}

class CheckpointTest : public DataPlaneFixture {
 protected:
  // Every expert of the model: (name, expert).
  std::vector<std::pair<std::string, int64_t>> Experts() const {
    std::vector<std::pair<std::string, int64_t>> out;
    for (const MatrixDecl& m : model().matrices) {
      for (int64_t e = 0; e < m.options.experts; ++e)
        out.emplace_back(m.name, e);
    }
    return out;
  }

  // After another worker was killed for good: the survivor's status once
  // the coordinator's new plan (past `version`) gave it rank 0.
  v1::WorkerStatus AfterReplan(int survivor, int64_t version) {
    const absl::Time deadline = absl::Now() + absl::Seconds(15);
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(survivor);
      if (status.ok() && status->plan_version() > version &&
          status->rank() == 0) {
        return *status;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    ADD_FAILURE() << "no new plan on worker " << survivor;
    return {};
  }

  // Two workers checkpointing every step, each stopping itself at
  // `pause_at` (--test_pause_at) of step kKilledStep; steps before it run on
  // both and on reference_ (the replay).
  void StartPausingAt(const ModelDecl& model, const std::string& pause_at) {
    ClusterOptions options{.workers = 2, .lease_ttl_ms = 1500};
    options.checkpoint_dir = dir_ + "/ckpt";
    options.checkpoint_every = 1;
    for (int w = 0; w < 2; ++w) {
      options.worker_flags[w] = {absl::StrCat("--test_pause_at=", pause_at)};
    }
    ASSERT_NO_FATAL_FAILURE(StartJob(model, options));
    reference_.emplace(model, 2, PlannedAlgorithms());
    for (int64_t step = 1; step < kKilledStep; ++step) {
      ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(step), step));
      ASSERT_TRUE(reference_->Step(step).ok());
    }
  }

  // One worker, checkpointing every `every` steps (none for 0), with
  // `flags`; steps 1 to `through` run on it and on reference_ (the replay).
  void StartOneWorker(int64_t every, int64_t through,
                      std::vector<std::string> flags = {}) {
    const ModelDecl model = SmallModel(scheduler::Layout::kReplicated);
    ClusterOptions options{.workers = 1, .lease_ttl_ms = 1500};
    if (every > 0) {
      options.checkpoint_dir = dir_ + "/ckpt";
      options.checkpoint_every = every;
    }
    options.worker_flags[0] = std::move(flags);
    ASSERT_NO_FATAL_FAILURE(StartJob(model, options));
    reference_.emplace(model, 1, PlannedAlgorithms());
    for (int64_t step = 1; step <= through; ++step) {
      ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(step), step));
      ASSERT_TRUE(reference_->Step(step).ok());
    }
  }

  // One worker stopping itself (--test_pause_at) in step `step`: runs the
  // step, kills the worker once it stopped, and starts it again; the
  // step's call fails.
  void KillTheOnlyWorkerInStep(int64_t step) {
    Outcomes killed;
    std::thread stepping([&] { killed = RunStep(step); });
    const absl::Status stopped = WaitUntilStopped(0, absl::Seconds(30));
    ASSERT_NO_FATAL_FAILURE(KillWorker(0));
    stepping.join();
    ASSERT_TRUE(stopped.ok()) << stopped;
    ASSERT_TRUE(killed[0].has_value());
    EXPECT_FALSE(killed[0]->result.ok());
    ASSERT_NO_FATAL_FAILURE(RestartWorker(0));
  }

  static constexpr int64_t kKilledStep = 3;
  std::string dir_ = NewTempDir("checkpoints");
  std::optional<ReferenceModel> reference_;
};

TEST_F(CheckpointTest, WorkersWriteWhatTheyOwnEveryNStepsAndWhenAsked) {
  const ModelDecl model = SmallModel(scheduler::Layout::kUnreduced);
  ClusterOptions options{.workers = 2};
  options.checkpoint_dir = dir_ + "/ckpt";
  options.checkpoint_every = 3;
  ASSERT_NO_FATAL_FAILURE(StartJob(model, options));
  ReferenceModel reference(model, 2, PlannedAlgorithms());
  for (int64_t step = 1; step <= 6; ++step) {
    ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(step), step));
    ASSERT_TRUE(reference.Step(step).ok());
  }
  std::set<std::pair<std::string, int64_t>> covered;
  for (int w = 0; w < workers(); ++w) {
    ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(w, 6, /*restored=*/false));
  }
  for (int rank = 0; rank < plan().workers_size(); ++rank) {
    const std::string& id = plan().workers(rank);
    const int w = WorkerIndex(id);
    const std::string worker_dir = options.checkpoint_dir + "/" + id;
    absl::StatusOr<std::vector<int64_t>> steps =
        ListCheckpointSteps(worker_dir);
    ASSERT_TRUE(steps.ok()) << steps.status();
    EXPECT_EQ(*steps, (std::vector<int64_t>{3, 6})) << id;
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(worker_dir, 6);
    ASSERT_TRUE(loaded.ok()) << loaded.status();  // every CRC32C verified
    EXPECT_EQ(loaded->manifest.step, 6);
    EXPECT_EQ(loaded->manifest.plan_version, plan().version());
    EXPECT_EQ(loaded->manifest.worker_id, id);
    int means = 0;
    for (size_t t = 0; t < loaded->manifest.tensors.size(); ++t) {
      const CheckpointTensor& tensor = loaded->manifest.tensors[t];
      // The step's AdamW means of the unreduced tensor, beside the momentum.
      if (absl::StartsWith(tensor.name, "muonps.adamw_mean:")) {
        EXPECT_EQ(tensor.name, "muonps.adamw_mean:layers.0.norm.bias");
        ++means;
        continue;
      }
      EXPECT_EQ(Owner(tensor.name, tensor.expert), w) << tensor.name;
      EXPECT_TRUE(covered.emplace(tensor.name, tensor.expert).second)
          << tensor.name << "[" << tensor.expert << "] saved twice";
      absl::StatusOr<std::vector<float>> live =
          Momentum(w, tensor.name, tensor.expert);
      ASSERT_TRUE(live.ok()) << live.status();
      EXPECT_EQ(loaded->tensors[t], *live)
          << tensor.name << "[" << tensor.expert << "] differs from the "
          << "worker's momentum at step 6";
      EXPECT_LE(
          MaxRelativeError(loaded->tensors[t],
                           reference.momentum(tensor.name, tensor.expert)),
          kTolerance);
    }
    EXPECT_EQ(means, 1) << id;
  }
  const auto experts = Experts();
  const std::set<std::pair<std::string, int64_t>> every(experts.begin(),
                                                        experts.end());
  EXPECT_EQ(covered, every);

  // Step 7 is no multiple of 3; a Checkpoint call makes step 8 one, on the
  // asking trainer's worker only.
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(7), 7));
  absl::StatusOr<int64_t> last = client(0).RequestCheckpoint();
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(*last, 6);
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(8), 8));
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(0, 8, /*restored=*/false));
  absl::StatusOr<v1::WorkerStatus> other = WorkerStatus(1);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->last_checkpoint_step(), 6);
}

TEST_F(CheckpointTest, KilledWorkerRestoresItsCheckpointAndTheJobResumes) {
  ASSERT_NO_FATAL_FAILURE(StartOneWorker(/*every=*/2, /*through=*/4));
  ReferenceModel& reference = *reference_;
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(0, 4, /*restored=*/false));
  std::map<std::pair<std::string, int64_t>, std::vector<float>> before;
  for (const auto& item : Experts()) {
    absl::StatusOr<std::vector<float>> m = Momentum(0, item.first, item.second);
    ASSERT_TRUE(m.ok()) << m.status();
    before[item] = *m;
  }

  ASSERT_NO_FATAL_FAILURE(KillWorker(0));
  ASSERT_NO_FATAL_FAILURE(RestartWorker(0));
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(0, 4, /*restored=*/true));
  for (const auto& [item, values] : before) {
    absl::StatusOr<std::vector<float>> m = Momentum(0, item.first, item.second);
    ASSERT_TRUE(m.ok()) << item.first << ": " << m.status();
    EXPECT_EQ(*m, values) << item.first << "[" << item.second << "]";
    // The replay: the same four steps in one process.
    EXPECT_LE(MaxRelativeError(*m, reference.momentum(item.first, item.second)),
              kTolerance)
        << item.first << "[" << item.second << "]";
  }
  // The trainer resumes from step 4: step 5 lands exactly where an
  // uninterrupted run does (the restarted worker's client attaches again).
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(5), 5));
  ASSERT_TRUE(reference.Step(5).ok());
  ExpectMatchesReference(reference, kTolerance);
}

// The restarted worker learns from its trainer's step record that the
// parameters hold step 3, whose momentum no checkpoint holds: under the
// strict default the next step names the lost matrices; with
// allow_momentum_reset they start from zero, and the step says so.
TEST_F(CheckpointTest, RestoredMomentumOfAnotherStepThanTheTrainersIsDropped) {
  const ModelDecl model = SmallModel(scheduler::Layout::kReplicated);
  ClusterOptions options{.workers = 1, .lease_ttl_ms = 1500};
  options.checkpoint_dir = dir_ + "/ckpt";
  options.checkpoint_every = 2;
  options.allow_momentum_reset = true;
  ASSERT_NO_FATAL_FAILURE(StartJob(model, options));
  ReferenceModel reference(model, 1, PlannedAlgorithms());
  for (int64_t step = 1; step <= 3; ++step) {  // checkpoint of step 2 only
    ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(step), step));
    ASSERT_TRUE(reference.Step(step).ok());
  }
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(0, 2, /*restored=*/false));
  ASSERT_NO_FATAL_FAILURE(KillWorker(0));
  ASSERT_NO_FATAL_FAILURE(RestartWorker(0));
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(0, 2, /*restored=*/true));
  // The trainer goes on with step 4, not 3: momentum of step 2 would mix
  // steps, so every expert starts from zero and the step says so.
  const Outcomes outcomes = RunStep(4);
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(outcomes, 4));
  EXPECT_EQ(outcomes[0]->result->momentum_reset,
            static_cast<int64_t>(Experts().size()));
  for (const auto& item : Experts()) {
    reference.ResetMomentum(item.first, item.second);
  }
  ASSERT_TRUE(reference.Step(4).ok());
  ExpectMatchesReference(reference, kTolerance);
  const std::string logged = WorkerLog(0);
  EXPECT_NE(logged.find("step record says the parameters hold step 3"),
            std::string::npos)
      << logged;
}

TEST_F(CheckpointTest, SurvivorRestoresALostOwnersMomentumOfTheJobsStep) {
  const ModelDecl model = SmallModel(scheduler::Layout::kReplicated);
  ClusterOptions options{.workers = 2, .lease_ttl_ms = 1500};
  options.checkpoint_dir = dir_ + "/ckpt";
  options.checkpoint_every = 1;
  ASSERT_NO_FATAL_FAILURE(StartJob(model, options));
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(step), step));
  }
  const int lost = WorkerAtPlanRank(1), survivor = WorkerAtPlanRank(0);
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(lost, 3, /*restored=*/false));
  std::map<std::pair<std::string, int64_t>, std::vector<float>> theirs;
  for (const auto& item : Experts()) {
    if (Owner(item.first, item.second) != lost) continue;
    absl::StatusOr<std::vector<float>> m =
        Momentum(lost, item.first, item.second);
    ASSERT_TRUE(m.ok()) << m.status();
    theirs[item] = *m;
  }
  ASSERT_FALSE(theirs.empty()) << "the plan should split the matrices";
  ASSERT_NO_FATAL_FAILURE(KillWorker(lost));
  const v1::WorkerStatus status = AfterReplan(survivor, plan().version());
  EXPECT_EQ(status.restored_step(), 3);
  for (const auto& [item, values] : theirs) {
    absl::StatusOr<std::vector<float>> m =
        Momentum(survivor, item.first, item.second);
    ASSERT_TRUE(m.ok()) << item.first << ": " << m.status();
    EXPECT_EQ(*m, values) << item.first << "[" << item.second << "]";
  }
}

// A worker killed right after it committed a step that was due for a
// checkpoint (before it answered its trainer): the step's checkpoint was
// written before the vote, so the survivor restores the lost matrices'
// momentum of that very step, equal to the replay's, and the job goes on
// (once a checkpoint written after the commit would have been missing, and
// every later step failed).
TEST_F(CheckpointTest, AKillRightAfterTheCommitFindsThatStepsCheckpoint) {
  ASSERT_NO_FATAL_FAILURE(
      StartPausingAt(SmallModel(scheduler::Layout::kReplicated),
                     absl::StrCat("committed@", kKilledStep, "@rank1")));
  ReferenceModel& reference = *reference_;
  ASSERT_TRUE(reference.Step(kKilledStep).ok());
  const int lost = WorkerAtPlanRank(1), survivor = WorkerAtPlanRank(0);
  Outcomes killed;
  std::thread stepping([&] { killed = RunStep(kKilledStep); });
  const absl::Status stopped = WaitUntilStopped(lost, absl::Seconds(30));
  ASSERT_NO_FATAL_FAILURE(KillWorker(lost));
  stepping.join();
  ASSERT_TRUE(stopped.ok()) << stopped;
  // Committed here and on the survivor, answered nowhere on the victim.
  ASSERT_TRUE(killed[lost].has_value());
  EXPECT_FALSE(killed[lost]->result.ok());
  const v1::WorkerStatus status = AfterReplan(survivor, plan().version());
  EXPECT_EQ(status.last_step(), kKilledStep);
  EXPECT_EQ(status.restored_step(), kKilledStep);
  int restored = 0;
  for (const auto& [name, expert] : Experts()) {
    if (Owner(name, expert) != lost) continue;
    absl::StatusOr<std::vector<float>> m = Momentum(survivor, name, expert);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status();
    EXPECT_LE(MaxRelativeError(*m, reference.momentum(name, expert)),
              kTolerance)
        << name << "[" << expert << "]";
    ++restored;
  }
  EXPECT_GT(restored, 0) << "the plan should split the matrices";
}

// Both workers killed right after committing step 3, before any trainer
// heard: each restarted worker takes step 3 from its trainer's step record,
// its momentum and the step's AdamW means (which died with both stagings)
// from its checkpoint of step 3, so the retries are answered
// already_applied, AdamW steps once, and the job goes on exactly.
TEST_F(CheckpointTest, BothWorkersKilledAfterTheCommitLoseNoAdamWMeans) {
  ASSERT_NO_FATAL_FAILURE(
      StartPausingAt(SmallModel(scheduler::Layout::kUnreduced),
                     absl::StrCat("committed@", kKilledStep)));
  ReferenceModel& reference = *reference_;
  Outcomes killed;
  std::thread stepping([&] { killed = RunStep(kKilledStep); });
  for (int w = 0; w < 2; ++w) {
    const absl::Status stopped = WaitUntilStopped(w, absl::Seconds(30));
    ASSERT_NO_FATAL_FAILURE(KillWorker(w));
    EXPECT_TRUE(stopped.ok()) << stopped;
  }
  stepping.join();
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(killed[w].has_value());
    EXPECT_FALSE(killed[w]->result.ok());
    ASSERT_NO_FATAL_FAILURE(RestartWorker(w));
  }
  const std::vector<RetryingLoop> loops = RunRetryingLoops(
      kKilledStep, kKilledStep + 1, nullptr, absl::Seconds(60));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(loops[r].finished)
        << "trainer " << r << ": " << loops[r].last_failure;
    EXPECT_EQ(loops[r].resets, 0) << "trainer " << r;
  }
  for (int w = 0; w < 2; ++w) {
    EXPECT_TRUE(absl::StrContains(WorkerLog(w),
                                  "step 3's AdamW means read from its "
                                  "checkpoint"))
        << WorkerLog(w);
  }
  for (int64_t step = kKilledStep; step <= kKilledStep + 1; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
  }
  // The momentum is read from the owners of the plan the restarts made.
  const absl::Status planned = WaitForFullPlan(absl::Seconds(20));
  ASSERT_TRUE(planned.ok()) << planned;
  ExpectMatchesReference(reference, kTolerance);
}

// One worker decides a step early (its updates go into the parameters as
// they land) only where a kill part-way through it would lose the step's
// state anyway. Right after a step due for a checkpoint it does not: a kill
// in the middle of step 3 (every vote in, nothing decided) leaves the
// parameters of step 2, the restarted worker restores step 2's momentum,
// and the retried steps land where an uninterrupted run does.
TEST_F(CheckpointTest, OneWorkerKilledInTheStepAfterACheckpointGoesOnExactly) {
  ASSERT_NO_FATAL_FAILURE(StartOneWorker(/*every=*/2, /*through=*/2,
                                         {"--test_pause_at=prepared@3"}));
  ReferenceModel& reference = *reference_;
  ASSERT_NO_FATAL_FAILURE(KillTheOnlyWorkerInStep(3));
  const std::vector<RetryingLoop> loops =
      RunRetryingLoops(3, 6, nullptr, absl::Seconds(60));
  ASSERT_TRUE(loops[0].finished) << loops[0].last_failure;
  EXPECT_EQ(loops[0].resets, 0);
  for (int64_t step = 3; step <= 6; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
  }
  ExpectMatchesReference(reference, kTolerance);
}

// One worker whose job keeps no checkpoints decides each step once its
// gradients are checked. Killed right then (the step record says the
// trainer's parameters are being written), its successor has neither the
// momentum nor a way to know how much of step 3 the parameters hold: the
// retry is refused naming both and the state to reload, never a step on
// parameters part-way.
TEST_F(CheckpointTest, OneWorkerKilledAfterDecidingEarlyNamesWhatToReload) {
  ASSERT_NO_FATAL_FAILURE(StartOneWorker(/*every=*/0, /*through=*/2,
                                         {"--test_pause_at=decided@3"}));
  ASSERT_NO_FATAL_FAILURE(KillTheOnlyWorkerInStep(3));
  // The retry, once the restarted worker is planned in again.
  absl::Status retried = absl::UnavailableError("not tried");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline &&
         (retried.code() == absl::StatusCode::kUnavailable ||
          retried.code() == absl::StatusCode::kDeadlineExceeded)) {
    const Outcomes again = RunStep(3);
    ASSERT_TRUE(again[0].has_value());
    retried = again[0]->result.status();
    if (!retried.ok()) absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_EQ(retried.code(), absl::StatusCode::kFailedPrecondition) << retried;
  EXPECT_TRUE(absl::StrContains(retried.message(), "lost its momentum"))
      << retried;
  EXPECT_TRUE(
      absl::StrContains(retried.message(), "trainer hold part of step 3"))
      << retried;
  EXPECT_TRUE(absl::StrContains(retried.message(), "saved after step 2"))
      << retried;
}

// The job's only worker told to stop between steps (SIGTERM: a rolling
// update, a node drain) cannot hand its momentum to anyone: the coordinator
// refuses its drain. It persists the momentum of its last step into the
// job's checkpoint instead, though no checkpoint was due, and its
// successor goes on from there exactly.
TEST_F(CheckpointTest, TheOnlyWorkerStoppedBetweenStepsGoesOnExactly) {
  ASSERT_NO_FATAL_FAILURE(StartOneWorker(/*every=*/1000, /*through=*/3));
  ReferenceModel& reference = *reference_;
  ASSERT_NO_FATAL_FAILURE(SignalWorker(0, SIGTERM));
  const absl::StatusOr<int> exited = WaitForWorkerExit(0, absl::Seconds(30));
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << *exited;
  EXPECT_TRUE(absl::StrContains(WorkerLog(0), "persisted the momentum"))
      << WorkerLog(0);
  ASSERT_NO_FATAL_FAILURE(RestartWorker(0));
  const std::vector<RetryingLoop> loops =
      RunRetryingLoops(4, 6, nullptr, absl::Seconds(60));
  ASSERT_TRUE(loops[0].finished) << loops[0].last_failure;
  EXPECT_EQ(loops[0].resets, 0);
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(0, 3, /*restored=*/true));
  for (int64_t step = 4; step <= 6; ++step) {
    ASSERT_TRUE(reference.Step(step).ok());
  }
  ExpectMatchesReference(reference, kTolerance);
}

TEST_F(CheckpointTest, SurvivorNeverInstallsMomentumOfAnotherStep) {
  const ModelDecl model = SmallModel(scheduler::Layout::kReplicated);
  ClusterOptions options{.workers = 2, .lease_ttl_ms = 1500};
  options.checkpoint_dir = dir_ + "/ckpt";
  options.checkpoint_every = 2;
  ASSERT_NO_FATAL_FAILURE(StartJob(model, options));
  for (int64_t step = 1; step <= 3; ++step) {  // checkpoint of step 2 only
    ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(step), step));
  }
  const int lost = WorkerAtPlanRank(1), survivor = WorkerAtPlanRank(0);
  ASSERT_NO_FATAL_FAILURE(WaitForCheckpointStatus(lost, 2, /*restored=*/false));
  ASSERT_NO_FATAL_FAILURE(KillWorker(lost));
  const v1::WorkerStatus status = AfterReplan(survivor, plan().version());
  EXPECT_EQ(status.restored_step(), -1);
  for (const auto& item : Experts()) {
    if (Owner(item.first, item.second) != lost) continue;
    // Left at zero (no momentum yet), not the momentum of step 2.
    EXPECT_EQ(Momentum(survivor, item.first, item.second).status().code(),
              absl::StatusCode::kNotFound)
        << item.first;
  }
  const std::string logged = WorkerLog(survivor);
  EXPECT_NE(logged.find("have no checkpoint of step 3"), std::string::npos)
      << logged;
}

TEST_F(CheckpointTest, MomentumAboveTheGrpcMessageLimitMovesInChunks) {
  // 4096 x 14336 floats: 224 MiB, 56 times gRPC's default 4 MiB limit.
  ModelDecl model;
  model.matrices.push_back({"big.w", 4096, 14336, {}});
  ASSERT_NO_FATAL_FAILURE(StartJob(model, ClusterOptions{.workers = 1}));
  std::vector<float> values(int64_t{4096} * 14336);
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] =
        static_cast<float>(static_cast<int64_t>(i % 8191) - 4095) / 4096.0f;
  }
  const absl::Time start = absl::Now();
  ASSERT_TRUE(client(0).RestoreMomentum("big.w", 0, values).ok());
  absl::StatusOr<std::vector<float>> back = client(0).OwnedMomentum("big.w", 0);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == values);
  std::cerr << "224 MiB of momentum out and back in "
            << absl::ToDoubleMilliseconds(absl::Now() - start) << " ms\n";
  // A wrong total is refused naming the field, nothing changed.
  const absl::Status short_one = client(0).RestoreMomentum(
      "big.w", 0, std::vector<float>(values.begin(), values.begin() + 1000));
  EXPECT_EQ(short_one.code(), absl::StatusCode::kInvalidArgument) << short_one;
}

}  // namespace
}  // namespace testing
}  // namespace muonps
