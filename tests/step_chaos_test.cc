// Atomic steps with real processes (a coordinator, two CPU workers over TLS
// and tokens, two trainer ranks stepping a model of every layout): a worker
// stops itself (--test_pause_at) at a point of step 3 (of step 1 too, the
// first a rank 0 opens, which it has decided nothing before), on plan rank 0 or
// 1: before the exchange, after the first bucket's transfers, after its vote,
// after its commit. Then either
//  - it is frozen past the I/O timeout and let go (SIGSTOP, SIGCONT: the
//    same processes after a transient failure): the other trainer sees a
//    named error within the timeout (or the step), its worker's status
//    answers at once meanwhile, no lease expires, and the trainers' retries
//    finish the step exactly once: parameters, momentum and AdamW equal a
//    failure-free run; or
//  - it is killed (kill -9) and restarted: the other trainer sees a named
//    error within the timeout; then the retries finish the step and the
//    next one from every kill point, nothing applied twice: a step nobody
//    committed runs once, one the killed worker applied is found in its
//    trainer's step record, one it had not applied while its peer had is
//    repaired from the peer's trainer (the killed worker's momentum starts
//    over, which the replay does too); with a trainer that keeps only its
//    rows of a matrix, that last case is DATA_LOSS naming why; or
//  - it is frozen in its transfers until its lease expires (I/O timeout far
//    longer): the new plan aborts the other worker's step at once, which
//    fails within the lease naming the lost worker; after a restart,
//    training goes on.
#include <gtest/gtest.h>
#include <signal.h>

#include <iostream>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::LoopOutcome;
using testing::MaxRelativeError;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::StepOutcome;

constexpr int kWorkers = 2;
constexpr int64_t kIoTimeoutMs = 1500;
constexpr absl::Duration kIoTimeout = absl::Milliseconds(kIoTimeoutMs);
// Scheduling and the gRPC hop on a loaded two-core machine.
constexpr absl::Duration kMargin = absl::Seconds(3);
constexpr double kTolerance = 1e-5;
constexpr int64_t kFailingStep = 3;

struct ChaosCase {
  const char* point;  // --test_pause_at's
  int rank;           // of the worker that stops
  int64_t step = kFailingStep;
};

std::string CaseName(const ::testing::TestParamInfo<ChaosCase>& info) {
  std::string point = info.param.point;
  point[0] = static_cast<char>(point[0] - 'a' + 'A');
  return absl::StrCat(point, "OnRank", info.param.rank,
                      info.param.step == kFailingStep
                          ? ""
                          : absl::StrCat("OfStep", info.param.step));
}

class StepChaosTest : public DataPlaneFixture,
                      public ::testing::WithParamInterface<ChaosCase> {
 protected:
  int64_t FailingStep() const { return GetParam().step; }

  // Starts the job with every worker set to stop at the case's point of
  // step 3 if it has the case's rank, and runs steps 1 and 2.
  void StartAndStep(int64_t lease_ttl_ms, int64_t io_timeout_ms = kIoTimeoutMs,
                    absl::Duration client_timeout = absl::Seconds(30)) {
    ClusterOptions cluster = {.workers = kWorkers,
                              .io_timeout_ms = io_timeout_ms,
                              .lease_ttl_ms = lease_ttl_ms,
                              .heartbeat_interval_ms = 300,
                              .client_timeout = client_timeout,
                              // The victim's momentum is in no checkpoint.
                              .allow_momentum_reset = true};
    for (int w = 0; w < kWorkers; ++w) {
      cluster.worker_flags[w] = {
          absl::StrCat("--test_pause_at=", GetParam().point, "@", FailingStep(),
                       "@rank", GetParam().rank)};
    }
    ASSERT_NO_FATAL_FAILURE(StartJob(model_decl_, cluster));
    before_.emplace(model_decl_, kWorkers, PlannedAlgorithms());
    after_.emplace(model_decl_, kWorkers, PlannedAlgorithms());
    for (int64_t step = 1; step < FailingStep(); ++step) {
      for (const auto& o : RunStep(step)) {
        ASSERT_TRUE(o.has_value() && o->result.ok()) << o->result.status();
      }
      ASSERT_TRUE(before_->Step(step).ok());
      ASSERT_TRUE(after_->Step(step).ok());
    }
    victim_ = WorkerAtPlanRank(GetParam().rank);
    survivor_ = 1 - victim_;  // trainer r uses worker r
    // What dies with the victim: the survivor hands its own matrices over
    // (momentum_handover.h), the victim's start from zero.
    for (const testing::MatrixDecl& m : model_decl_.matrices) {
      for (int64_t e = 0; e < m.options.experts; ++e) {
        if (Owner(m.name, e) == victim_) lost_with_victim_.insert({m.name, e});
      }
    }
  }

  // Step 3 on every trainer, in the background, until the victim stopped.
  void StartFailingStep() {
    stepping_ = std::thread([this] { first_ = RunStep(FailingStep()); });
    const absl::Status stopped = WaitUntilStopped(victim_, absl::Seconds(30));
    if (!stopped.ok()) SignalWorker(victim_, SIGKILL);
    ASSERT_TRUE(stopped.ok()) << stopped;
  }

  // The survivor's trainer: the step, or a named error within the timeout.
  void ExpectSurvivorAnsweredInTime() {
    ASSERT_TRUE(first_[survivor_].has_value());
    const StepOutcome& o = *first_[survivor_];
    std::cerr << "survivor's first answer after " << o.elapsed << ": "
              << o.result.status() << "\n";
    EXPECT_LT(o.elapsed, kIoTimeout + kMargin) << o.result.status();
    if (o.result.ok()) return;
    const absl::StatusCode code = o.result.status().code();
    EXPECT_TRUE(code == absl::StatusCode::kUnavailable ||
                code == absl::StatusCode::kDeadlineExceeded ||
                code == absl::StatusCode::kAborted)
        << o.result.status();
    EXPECT_TRUE(absl::StrContains(o.result.status().message(),
                                  absl::StrCat("step ", FailingStep())))
        << o.result.status();
  }

  // Trainer `rank`'s Muon matrices against `reference` (AdamW tensors are
  // the client's: stepped only when its Step call is answered).
  double MatrixError(int rank, const ReferenceModel& reference) {
    double worst = 0;
    for (const testing::MatrixDecl& m : model_decl_.matrices) {
      const TensorBuffers b = Buffers(rank, m.name);
      const std::vector<float>& full = reference.param(m.name);
      if (b.param_elements == static_cast<int64_t>(full.size())) {
        worst = std::max(
            worst, MaxRelativeError(
                       absl::MakeConstSpan(b.param, b.param_elements), full));
        continue;
      }
      // Its rows of every expert.
      std::vector<float> rows;
      const int64_t size = m.rows * m.cols;
      for (int64_t e = 0; e < m.options.experts; ++e) {
        rows.insert(rows.end(), full.begin() + e * size + b.row_begin * m.cols,
                    full.begin() + e * size + b.row_end * m.cols);
      }
      worst = std::max(
          worst, MaxRelativeError(
                     absl::MakeConstSpan(b.param, b.param_elements), rows));
    }
    return worst;
  }

  ModelDecl model_decl_ = MixedModel();
  std::optional<ReferenceModel> before_;  // failure-free run to step 2
  std::optional<ReferenceModel> after_;   // ... to the last step run
  int victim_ = 0;
  int survivor_ = 1;
  std::set<std::pair<std::string, int64_t>> lost_with_victim_;
  std::thread stepping_;
  std::vector<std::optional<StepOutcome>> first_;
};

class StepChaosFreezeTest : public StepChaosTest {};

TEST_P(StepChaosFreezeTest, TheRetriesFinishTheStepExactlyOnce) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*lease_ttl_ms=*/8000));
  ASSERT_NO_FATAL_FAILURE(StartFailingStep());
  // The survivor's worker waits on the frozen one: its status (what
  // heartbeats and operators read) still answers at once.
  const absl::Time asked = absl::Now();
  absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(survivor_);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_LT(absl::Now() - asked, absl::Milliseconds(500));
  absl::SleepFor(kIoTimeout + absl::Seconds(1));
  SignalWorker(victim_, SIGCONT);
  stepping_.join();
  ExpectSurvivorAnsweredInTime();
  // Every trainer retries step 3 until it is answered, then steps 4.
  const std::vector<LoopOutcome> loops =
      RunTrainerLoops(FailingStep(), FailingStep() + 1, 4);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(loops[r].finished)
        << "trainer " << r << ": " << loops[r].attempts.back().result.status();
  }
  ASSERT_TRUE(after_->Step(FailingStep()).ok());
  ASSERT_TRUE(after_->Step(FailingStep() + 1).ok());
  ExpectMatchesReference(*after_, kTolerance);
  // No lease expired: the plan is the one the job started with.
  status = WorkerStatus(survivor_);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->plan_version(), plan().version());
}

INSTANTIATE_TEST_SUITE_P(
    Points, StepChaosFreezeTest,
    ::testing::Values(ChaosCase{"exchange", 1}, ChaosCase{"transfer", 1},
                      ChaosCase{"prepared", 1}, ChaosCase{"committed", 1},
                      ChaosCase{"prepared", 0}, ChaosCase{"committed", 0}),
    CaseName);

// Every trainer keeps whole parameters (a row-sharded matrix's too), so a
// trainer that missed a step can be repaired from another.
class StepChaosKillTest : public StepChaosTest {
 protected:
  StepChaosKillTest() {
    for (testing::MatrixDecl& m : model_decl_.matrices) {
      m.options.shard_params = false;
    }
  }
};

TEST_P(StepChaosKillTest, NothingAppliesTwiceAfterARestart) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*lease_ttl_ms=*/2000));
  ASSERT_NO_FATAL_FAILURE(StartFailingStep());
  ASSERT_NO_FATAL_FAILURE(KillWorker(victim_));
  stepping_.join();
  ExpectSurvivorAnsweredInTime();
  ASSERT_TRUE(first_[victim_].has_value());
  EXPECT_FALSE(first_[victim_]->result.ok());
  const std::string point = GetParam().point;
  const bool victim_is_rank0 = GetParam().rank == 0;
  // Who applied step 3 before the kill: rank 0 commits once every vote is
  // in, the others when they hear its decision.
  const bool committed_anywhere =
      (point == "prepared" && !victim_is_rank0) || point == "committed";
  const bool victim_applied = point == "committed";
  ASSERT_TRUE(after_->Step(FailingStep()).ok());
  EXPECT_LE(MatrixError(victim_, victim_applied ? *after_ : *before_),
            kTolerance);
  EXPECT_LE(MatrixError(survivor_, committed_anywhere ? *after_ : *before_),
            kTolerance);

  ASSERT_NO_FATAL_FAILURE(RestartWorker(victim_));
  const absl::Status planned = WaitForFullPlan(absl::Seconds(30));
  ASSERT_TRUE(planned.ok()) << planned;
  // Every kill point converges. The restarted worker reads its trainer's
  // step record: a step its predecessor applied is answered
  // already_applied, one it did not apply while its peer committed it is
  // repaired from the peer's trainer, and one whose rank 0 died before
  // deciding is redone. Then step 4 runs on the momentum that survived.
  // The redo on the survivor, rank 0 now, stops at the case's point again:
  // let it go on.
  std::thread release;
  if (!committed_anywhere && point == "prepared") {
    release = std::thread([this] {
      if (WaitUntilStopped(survivor_, absl::Seconds(30)).ok()) {
        SignalWorker(survivor_, SIGCONT);
      }
    });
  }
  const std::vector<LoopOutcome> retry =
      RunTrainerLoops(FailingStep(), FailingStep() + 1, 4);
  if (release.joinable()) release.join();
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(retry[r].finished)
        << "trainer " << r << ": " << retry[r].attempts.back().result.status();
    for (const StepOutcome& o : retry[r].attempts) {
      const absl::Status& s = o.result.status();
      // The other trainer not there yet: a peer failure, never DATA_LOSS.
      EXPECT_TRUE(s.ok() || absl::IsUnavailable(s) ||
                  absl::IsDeadlineExceeded(s) || absl::IsAborted(s))
          << s;
    }
  }
  // What the killed worker owned starts from zero (allow_momentum_reset;
  // no checkpoints), what moved from the survivor was handed over: after
  // step 3 when step 3 committed before the kill, before it otherwise.
  std::optional<ReferenceModel> replay;
  replay.emplace(model_decl_, kWorkers, PlannedAlgorithms());
  for (int64_t step = 1; step < FailingStep(); ++step) {
    ASSERT_TRUE(replay->Step(step).ok());
  }
  if (committed_anywhere) {
    ASSERT_TRUE(replay->Step(FailingStep()).ok());
  }
  for (const auto& [name, expert] : lost_with_victim_) {
    replay->ResetMomentum(name, expert);
  }
  if (!committed_anywhere) {
    ASSERT_TRUE(replay->Step(FailingStep()).ok());
  }
  ASSERT_TRUE(replay->Step(FailingStep() + 1).ok());
  ExpectMatchesReference(*replay, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Points, StepChaosKillTest,
                         ::testing::Values(ChaosCase{"exchange", 1},
                                           ChaosCase{"transfer", 1},
                                           ChaosCase{"prepared", 1},
                                           ChaosCase{"committed", 1},
                                           ChaosCase{"prepared", 0},
                                           // Rank 0 stops on the first
                                           // step it ever opened: it has
                                           // decided none.
                                           ChaosCase{"prepared", 0, 1}),
                         CaseName);

// The trainers keep only their rows of a row-sharded matrix (MixedModel):
// the rows the killed worker did not apply exist in no other trainer, so
// the retry is refused with DATA_LOSS saying so, and nothing is applied.
class StepChaosRowsTest : public StepChaosTest {};

TEST_P(StepChaosRowsTest, AMissedStepOfRowsOnlyOneTrainerKeepsIsNamed) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*lease_ttl_ms=*/2000));
  ASSERT_NO_FATAL_FAILURE(StartFailingStep());
  ASSERT_NO_FATAL_FAILURE(KillWorker(victim_));
  stepping_.join();
  ASSERT_NO_FATAL_FAILURE(RestartWorker(victim_));
  const absl::Status planned = WaitForFullPlan(absl::Seconds(30));
  ASSERT_TRUE(planned.ok()) << planned;
  const std::vector<LoopOutcome> retry =
      RunTrainerLoops(FailingStep(), FailingStep(), 3);
  bool named = false;
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_FALSE(retry[r].finished) << "trainer " << r;
    for (const StepOutcome& o : retry[r].attempts) {
      const absl::Status& s = o.result.status();
      if (!absl::IsDataLoss(s)) continue;
      named = true;
      for (const std::string& part :
           {absl::StrCat("worker \"w", victim_, "\" lost step 3"),
            std::string("keeps only its rows")}) {
        EXPECT_TRUE(absl::StrContains(s.message(), part)) << part << ": " << s;
      }
    }
  }
  EXPECT_TRUE(named);
  ASSERT_TRUE(after_->Step(FailingStep()).ok());
  EXPECT_LE(MatrixError(victim_, *before_), kTolerance);
  EXPECT_LE(MatrixError(survivor_, *after_), kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Points, StepChaosRowsTest,
                         ::testing::Values(ChaosCase{"prepared", 1}), CaseName);

// A worker frozen inside step 3's transfers whose lease then expires (as
// one killed beside an NCCL peer, which waits on it until the I/O timeout):
// the plan that drops it aborts the survivor's step at once, so that
// trainer's step fails within the lease (plus the watch and scheduling)
// naming the lost worker, not after the I/O timeout, and nothing is
// applied. The frozen worker is then killed and restarted, and training
// goes on.
class StepChaosLeaseTest : public StepChaosTest {};

TEST_P(StepChaosLeaseTest, TheSurvivorsStepFailsWithinTheLeaseNamingTheLost) {
  constexpr int64_t kLeaseMs = 1500;
  constexpr int64_t kLongIoTimeoutMs = 20000;
  ASSERT_NO_FATAL_FAILURE(StartAndStep(kLeaseMs, kLongIoTimeoutMs));
  // A thread per trainer: the victim's does not return while it is frozen.
  std::vector<std::optional<StepOutcome>> outcome(kWorkers);
  std::vector<std::thread> trainers;
  for (int r = 0; r < kWorkers; ++r) {
    trainers.emplace_back([this, r, &outcome] {
      WriteGradients(r, FailingStep());
      const absl::Time start = absl::Now();
      absl::StatusOr<StepResult> result = client(r).Step(FailingStep());
      outcome[r] = StepOutcome{std::move(result), absl::Now() - start};
    });
  }
  const absl::Status stopped = WaitUntilStopped(victim_, absl::Seconds(30));
  if (!stopped.ok()) KillWorker(victim_);
  trainers[survivor_].join();
  ASSERT_TRUE(stopped.ok()) << stopped;
  const StepOutcome& o = *outcome[survivor_];
  std::cerr << "survivor's step failed after " << o.elapsed << ": "
            << o.result.status() << "\n";
  EXPECT_LT(o.elapsed, absl::Milliseconds(kLeaseMs) + absl::Seconds(2));
  EXPECT_TRUE(absl::IsUnavailable(o.result.status())) << o.result.status();
  for (const std::string& part :
       {absl::StrCat("worker \"w", victim_, "\" left the job"),
        std::string("lease expired"), absl::StrCat("step ", FailingStep())}) {
    EXPECT_TRUE(absl::StrContains(o.result.status().message(), part))
        << part << " not in " << o.result.status();
  }
  ASSERT_NO_FATAL_FAILURE(KillWorker(victim_));
  trainers[victim_].join();
  EXPECT_FALSE(outcome[victim_]->result.ok());
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_LE(MatrixError(r, *before_), kTolerance) << "trainer " << r;
  }

  ASSERT_NO_FATAL_FAILURE(RestartWorker(victim_));
  const absl::Status planned = WaitForFullPlan(absl::Seconds(30));
  ASSERT_TRUE(planned.ok()) << planned;
  const std::vector<LoopOutcome> loops =
      RunTrainerLoops(FailingStep(), FailingStep() + 1, 4);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(loops[r].finished)
        << "trainer " << r << ": " << loops[r].attempts.back().result.status();
  }
  // Step 3 ran once, on the new plan: the killed worker's matrices started
  // over, the survivor's were handed over where they moved.
  ReferenceModel replay(model_decl_, kWorkers, PlannedAlgorithms());
  for (int64_t step = 1; step < FailingStep(); ++step) {
    ASSERT_TRUE(replay.Step(step).ok());
  }
  for (const auto& [name, expert] : lost_with_victim_) {
    replay.ResetMomentum(name, expert);
  }
  ASSERT_TRUE(replay.Step(FailingStep()).ok());
  ASSERT_TRUE(replay.Step(FailingStep() + 1).ok());
  ExpectMatchesReference(replay, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Points, StepChaosLeaseTest,
                         ::testing::Values(ChaosCase{"transfer", 1}), CaseName);

// The trainers' Step calls pass their deadline (1 s) while a worker is
// stopped before the exchange (the step is then refused: the calls were
// cancelled) or after its commit (rank 0 committed too, and the step
// completes behind the callers' backs). Either way the retries answer, and
// AdamW runs once per step: before, the worker ignored the cancellation
// and the client skipped AdamW on the already_applied retry.
class StepChaosDeadlineTest : public StepChaosTest {};

TEST_P(StepChaosDeadlineTest, AdamWRunsOncePerStepWhatTheDeadlineCut) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(/*lease_ttl_ms=*/8000,
                                       /*io_timeout_ms=*/5000,
                                       /*client_timeout=*/absl::Seconds(1)));
  ASSERT_NO_FATAL_FAILURE(StartFailingStep());
  absl::SleepFor(absl::Milliseconds(1500));
  SignalWorker(victim_, SIGCONT);
  stepping_.join();
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(first_[r].has_value());
    EXPECT_EQ(first_[r]->result.status().code(),
              absl::StatusCode::kDeadlineExceeded)
        << "trainer " << r << ": " << first_[r]->result.status();
  }
  absl::SleepFor(absl::Seconds(1));  // the workers finish what they began
  const std::vector<LoopOutcome> loops =
      RunTrainerLoops(FailingStep(), FailingStep() + 1, 4);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(loops[r].finished)
        << "trainer " << r << ": " << loops[r].attempts.back().result.status();
    ASSERT_TRUE(loops[r].attempts[0].result.ok());
    EXPECT_EQ(loops[r].attempts[0].result->already_applied,
              std::string(GetParam().point) == "committed")
        << "trainer " << r;
    EXPECT_TRUE(loops[r].attempts[0].result->adamw_applied);
  }
  ASSERT_TRUE(after_->Step(FailingStep()).ok());
  ASSERT_TRUE(after_->Step(FailingStep() + 1).ok());
  ExpectMatchesReference(*after_, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(Points, StepChaosDeadlineTest,
                         ::testing::Values(ChaosCase{"exchange", 1},
                                           ChaosCase{"committed", 1}),
                         CaseName);

}  // namespace
}  // namespace muonps
