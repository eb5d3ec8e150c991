// The data plane when something goes wrong, with real processes on
// loopback (a coordinator, three workers, three trainer ranks stepping a
// model of every layout). Proves that a non-finite gradient on one rank
// rejects the step on every rank with INVALID_ARGUMENT naming the tensor
// and changes no parameter or momentum anywhere, and that the same step id
// then succeeds; that a retried step id is already_applied everywhere and
// changes nothing; and that a SIGKILLed worker or a trainer that never
// calls Step makes the others' Step fail with UNAVAILABLE or
// DEADLINE_EXCEEDED within the workers' --io_timeout_ms (not hang), while a
// trainer late by less than that still steps; and that Step calls cut by
// their deadline while a peer is frozen step AdamW exactly once on retry.
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::StateSnapshot;
using testing::StepOutcome;
using testing::StepScript;

constexpr int kWorkers = 3;
constexpr int64_t kIoTimeoutMs = 2000;
constexpr absl::Duration kIoTimeout = absl::Milliseconds(kIoTimeoutMs);
// Scheduling, the peers' own timeouts and the gRPC hop on a loaded
// two-core machine (sanitizers included); far below the clients' 30 s.
constexpr absl::Duration kMargin = absl::Seconds(3);
constexpr double kTolerance = 1e-5;

const ClusterOptions kCluster = {.workers = kWorkers,
                                 .io_timeout_ms = kIoTimeoutMs,
                                 .lease_ttl_ms = 1500,
                                 .heartbeat_interval_ms = 300};

using Outcomes = std::vector<std::optional<StepOutcome>>;

// Every stepping rank succeeded (and, unless `retry`, did new work).
void ExpectAllStepped(const Outcomes& outcomes, int64_t step,
                      bool retry = false) {
  for (size_t r = 0; r < outcomes.size(); ++r) {
    ASSERT_TRUE(outcomes[r].has_value()) << "trainer " << r;
    ASSERT_TRUE(outcomes[r]->result.ok())
        << "step " << step << " trainer " << r << ": "
        << outcomes[r]->result.status();
    EXPECT_EQ(outcomes[r]->result->already_applied, retry)
        << "step " << step << " trainer " << r;
  }
}

// Bitwise equality of two snapshots: parameters of every rank, momentum
// of every owned expert, AdamW step counts.
void ExpectUnchanged(const StateSnapshot& before, const StateSnapshot& after) {
  ASSERT_EQ(before.params.size(), after.params.size());
  for (size_t r = 0; r < before.params.size(); ++r) {
    for (const auto& [name, values] : before.params[r]) {
      EXPECT_TRUE(after.params[r].at(name) == values)
          << "trainer " << r << " param " << name << " changed";
    }
  }
  EXPECT_FALSE(before.momentum.empty());
  EXPECT_EQ(before.momentum.size(), after.momentum.size());
  for (const auto& [key, values] : before.momentum) {
    auto it = after.momentum.find(key);
    ASSERT_NE(it, after.momentum.end()) << "momentum of " << key << " is gone";
    EXPECT_TRUE(it->second == values) << "momentum of " << key << " changed";
  }
  EXPECT_EQ(before.adamw_steps, after.adamw_steps);
}

class DataPlaneFailureTest : public DataPlaneFixture {
 protected:
  // Starts the job and runs clean steps 1..`steps` on every rank, and on
  // reference_ too.
  void StartAndStep(int64_t steps) {
    ASSERT_NO_FATAL_FAILURE(StartJob(mixed_, kCluster));
    reference_.emplace(mixed_, kWorkers, PlannedAlgorithms());
    for (int64_t step = 1; step <= steps; ++step) {
      ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(step), step));
      ASSERT_TRUE(reference_->Step(step).ok());
    }
  }

  // The trainer whose worker has rank `plan_rank` in the plan.
  int TrainerAtPlanRank(int plan_rank) const {
    return WorkerAtPlanRank(plan_rank);  // trainer r uses worker r
  }

  const ModelDecl mixed_ = MixedModel();
  std::optional<ReferenceModel> reference_;
};

TEST_F(DataPlaneFailureTest,
       NanInOneTrainersGradientRejectsTheStepOnEveryRankAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(2));
  const StateSnapshot before = Snapshot();
  // A row_sharded matrix on the trainer of the last plan rank, so the
  // problem travels to rank 0 and back to everyone.
  const std::string poisoned = "layers.1.mlp.down";
  const int culprit = TrainerAtPlanRank(kWorkers - 1);
  StepScript script;
  script.after_write = [&](int rank) {
    if (rank == culprit) {
      Buffers(rank, poisoned).grad[5] = std::numeric_limits<float>::quiet_NaN();
    }
  };
  const Outcomes rejected = RunStep(3, script);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(rejected[r].has_value());
    const absl::Status& status = rejected[r]->result.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << "trainer " << r << ": " << status;
    EXPECT_TRUE(
        absl::StrContains(status.message(), absl::StrCat("\"", poisoned, "\"")))
        << "trainer " << r << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "NaN"))
        << "trainer " << r << ": " << status;
  }
  ExpectUnchanged(before, Snapshot());

  // The rejected step id was not consumed: it runs with clean gradients.
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(3), 3));
  ASSERT_TRUE(reference_->Step(3).ok());
  ExpectMatchesReference(*reference_, kTolerance);
}

TEST_F(
    DataPlaneFailureTest,
    InfInOneTrainersAdamWGradientRejectsTheStepOnEveryRankAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(2));
  const StateSnapshot before = Snapshot();
  // A replicated AdamW tensor on the trainer of plan rank 0.
  const std::string poisoned = "head.bias";
  const int culprit = TrainerAtPlanRank(0);
  StepScript script;
  script.after_write = [&](int rank) {
    if (rank == culprit) {
      Buffers(rank, poisoned).grad[7] = std::numeric_limits<float>::infinity();
    }
  };
  const Outcomes rejected = RunStep(3, script);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(rejected[r].has_value());
    const absl::Status& status = rejected[r]->result.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
        << "trainer " << r << ": " << status;
    EXPECT_TRUE(
        absl::StrContains(status.message(), absl::StrCat("\"", poisoned, "\"")))
        << "trainer " << r << ": " << status;
  }
  ExpectUnchanged(before, Snapshot());
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(3), 3));
  ASSERT_TRUE(reference_->Step(3).ok());
  ExpectMatchesReference(*reference_, kTolerance);
}

TEST_F(DataPlaneFailureTest,
       RetriedStepIdIsAlreadyAppliedOnEveryRankAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(3));
  const StateSnapshot before = Snapshot();
  // Other (finite) gradients in the buffers: a retry must not read them.
  StepScript script;
  script.write_gradients = false;
  script.after_write = [this](int rank) { WriteGradients(rank, 99); };
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(3, script), 3, true));
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(2, script), 2, true));
  ExpectUnchanged(before, Snapshot());

  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(4), 4));
  ASSERT_TRUE(reference_->Step(4).ok());
  ExpectMatchesReference(*reference_, kTolerance);
}

TEST_F(DataPlaneFailureTest, TrainerLateByLessThanTheIoTimeoutStillSteps) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(2));
  StepScript script;
  script.delay[TrainerAtPlanRank(0)] = kIoTimeout / 4;
  script.delay[TrainerAtPlanRank(kWorkers - 1)] = kIoTimeout / 2;
  ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(3, script), 3));
  ASSERT_TRUE(reference_->Step(3).ok());
  ExpectMatchesReference(*reference_, kTolerance);
}

// The trainers' Step calls pass their deadline (1 s) while a peer worker is
// frozen; it then thaws, within its peer's io timeout, and finishes what it
// began.
// Whatever the workers did with the cancelled calls (refused them, or, as
// before, ran the step behind the callers' backs), the retries step AdamW
// exactly once: before, the already_applied retry skipped it.
TEST_F(DataPlaneFailureTest, AStepPastTheClientsDeadlineStepsAdamWOnce) {
  ClusterOptions cluster = kCluster;
  cluster.workers = 2;
  cluster.io_timeout_ms = 5000;
  cluster.lease_ttl_ms = 8000;
  cluster.client_timeout = absl::Seconds(1);
  ASSERT_NO_FATAL_FAILURE(StartJob(mixed_, cluster));
  ReferenceModel reference(mixed_, 2, PlannedAlgorithms());
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_NO_FATAL_FAILURE(ExpectAllStepped(RunStep(step), step));
    ASSERT_TRUE(reference.Step(step).ok());
  }
  const int frozen = WorkerAtPlanRank(1);
  ASSERT_NO_FATAL_FAILURE(SignalWorker(frozen, SIGSTOP));
  // Thawed only once every call has passed its deadline: however late a
  // loaded machine issues them, they meet the worker frozen.
  for (const auto& o : RunStep(3)) {
    EXPECT_EQ(o->result.status().code(), absl::StatusCode::kDeadlineExceeded)
        << o->result.status();
  }
  ASSERT_NO_FATAL_FAILURE(SignalWorker(frozen, SIGCONT));
  absl::SleepFor(absl::Seconds(6));  // past the workers' io timeout
  const std::vector<testing::LoopOutcome> loops = RunTrainerLoops(3, 3, 3);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(loops[r].finished)
        << "trainer " << r << ": " << loops[r].attempts.back().result.status();
  }
  ASSERT_TRUE(reference.Step(3).ok());
  ExpectMatchesReference(reference, kTolerance);
}

// A failure that a peer, not the data, causes.
bool IsPeerFailure(const absl::Status& status) {
  return status.code() == absl::StatusCode::kUnavailable ||
         status.code() == absl::StatusCode::kDeadlineExceeded;
}

// Which worker fails, by its rank in the plan: 0 roots the step's
// agreement and the AdamW averaging; the last rank does not.
class DataPlanePeerFailureTest : public DataPlaneFailureTest,
                                 public ::testing::WithParamInterface<int> {};

TEST_P(DataPlanePeerFailureTest,
       KilledWorkerFailsTheSurvivorsNextStepWithinTheIoTimeout) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(2));
  const int victim = WorkerAtPlanRank(GetParam());
  ASSERT_NO_FATAL_FAILURE(KillWorker(victim));
  // Every trainer steps, the victim's own too (its worker is gone).
  const Outcomes outcomes = RunStep(3);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(outcomes[r].has_value());
    const StepOutcome& o = *outcomes[r];
    EXPECT_FALSE(o.result.ok()) << "trainer " << r;
    EXPECT_TRUE(IsPeerFailure(o.result.status()))
        << "trainer " << r << ": " << o.result.status();
    EXPECT_LT(o.elapsed, kIoTimeout + kMargin)
        << "trainer " << r << ": " << o.result.status();
  }
  EXPECT_EQ(outcomes[victim]->result.status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_P(DataPlanePeerFailureTest,
       FrozenWorkerFailsTheOthersStepWithinTheIoTimeout) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(2));
  // SIGSTOP: its connections stay open but nothing moves on them. Its own
  // trainer would wait out the client's timeout, so it does not step.
  const int frozen = WorkerAtPlanRank(GetParam());
  ASSERT_NO_FATAL_FAILURE(SignalWorker(frozen, SIGSTOP));
  StepScript script;
  script.silent = {frozen};
  const Outcomes outcomes = RunStep(3, script);
  for (int r = 0; r < kWorkers; ++r) {
    if (r == frozen) continue;
    ASSERT_TRUE(outcomes[r].has_value());
    const StepOutcome& o = *outcomes[r];
    EXPECT_TRUE(IsPeerFailure(o.result.status()))
        << "trainer " << r << ": " << o.result.status();
    EXPECT_LT(o.elapsed, kIoTimeout + kMargin)
        << "trainer " << r << ": " << o.result.status();
  }
  ASSERT_NO_FATAL_FAILURE(SignalWorker(frozen, SIGCONT));
}

TEST_P(DataPlanePeerFailureTest,
       TrainerThatNeverStepsFailsTheOthersStepWithinTheIoTimeout) {
  ASSERT_NO_FATAL_FAILURE(StartAndStep(2));
  const int silent = TrainerAtPlanRank(GetParam());
  StepScript script;
  script.silent = {silent};
  const Outcomes outcomes = RunStep(3, script);
  for (int r = 0; r < kWorkers; ++r) {
    if (r == silent) continue;
    ASSERT_TRUE(outcomes[r].has_value());
    const StepOutcome& o = *outcomes[r];
    EXPECT_FALSE(o.result.ok()) << "trainer " << r;
    EXPECT_TRUE(IsPeerFailure(o.result.status()))
        << "trainer " << r << ": " << o.result.status();
    EXPECT_LT(o.elapsed, kIoTimeout + kMargin)
        << "trainer " << r << ": " << o.result.status();
  }
  // The job goes on once the trainer is back: step 3 applies exactly once
  // within a few attempts (the silent worker still holds the transport its
  // peers dropped, so the first attempt may fail too), each attempt bounded
  // by the io timeout.
  bool stepped = false;
  for (int attempt = 1; attempt <= 3 && !stepped; ++attempt) {
    const Outcomes retry = RunStep(3);
    int ok = 0;
    for (int r = 0; r < kWorkers; ++r) {
      const StepOutcome& o = *retry[r];
      EXPECT_LT(o.elapsed, kIoTimeout + kMargin)
          << "attempt " << attempt << " trainer " << r << ": "
          << o.result.status();
      if (o.result.ok()) {
        EXPECT_FALSE(o.result->already_applied) << "trainer " << r;
        ++ok;
      } else {
        EXPECT_TRUE(IsPeerFailure(o.result.status()))
            << "attempt " << attempt << " trainer " << r << ": "
            << o.result.status();
      }
    }
    EXPECT_TRUE(ok == 0 || ok == kWorkers)
        << "attempt " << attempt << ": " << ok << " of " << kWorkers
        << " trainers stepped";
    stepped = ok == kWorkers;
  }
  ASSERT_TRUE(stepped) << "step 3 failed 3 times after the trainer came back";
  ASSERT_TRUE(reference_->Step(3).ok());
  ExpectMatchesReference(*reference_, kTolerance);
}

INSTANTIATE_TEST_SUITE_P(PlanRanks, DataPlanePeerFailureTest,
                         ::testing::Values(0, kWorkers - 1),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("PlanRank", info.param);
                         });

}  // namespace
}  // namespace muonps
