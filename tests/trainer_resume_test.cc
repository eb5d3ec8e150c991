// A trainer that restarts from its own saved state, with real processes on
// loopback (a coordinator, two CPU workers, two trainer ranks stepping a
// model of every layout). The trainer of rank 1 saves its state after step
// 2, steps 3 (its worker commits it), and dies before it saves again; a new
// trainer loads the state of step 2 and says so (Client::ResumeAfter):
//  - its first step, 3, is answered already_applied and `repaired`: its
//    worker copied rank 0's trainer's parameters and the step's AdamW means
//    into its buffers, so after step 4 every trainer equals the
//    failure-free run;
//  - loaded from a state two steps old, or keeping only its rows of a
//    row-sharded matrix (which no other trainer holds), the step is
//    refused with DATA_LOSS naming what to reload;
//  - a new trainer that does not say where it resumed gets the client's
//    FAILED_PRECONDITION naming the step its parameters miss, never OK.
#include <gtest/gtest.h>

#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::SavedTrainer;

constexpr int kWorkers = 2;
constexpr double kTolerance = 1e-5;
const ClusterOptions kCluster = {.workers = kWorkers,
                                 .io_timeout_ms = 3000,
                                 .lease_ttl_ms = 3000,
                                 .heartbeat_interval_ms = 300};

// Every trainer keeps whole parameters unless `rows`.
ModelDecl Model(bool rows) {
  ModelDecl model = MixedModel();
  for (testing::MatrixDecl& m : model.matrices) {
    m.options.shard_params = m.options.shard_params && rows;
  }
  return model;
}

class TrainerResumeTest : public DataPlaneFixture {
 protected:
  // Steps 1..3 on both ranks; rank 1's state is saved after step 2.
  void StepThreeSavingRankOneAfterTwo(const ModelDecl& model) {
    ASSERT_NO_FATAL_FAILURE(StartJob(model, kCluster));
    reference_.emplace(model, kWorkers, PlannedAlgorithms());
    for (int64_t step = 1; step <= 3; ++step) {
      if (step == 3) {
        absl::StatusOr<SavedTrainer> saved = SaveTrainer(1, 2);
        ASSERT_TRUE(saved.ok()) << saved.status();
        saved_ = *std::move(saved);
      }
      for (const auto& o : RunStep(step)) {
        ASSERT_TRUE(o.has_value() && o->result.ok())
            << "step " << step << ": " << o->result.status();
      }
      ASSERT_TRUE(reference_->Step(step).ok());
    }
  }

  // Rank 0's trainer steps `next`, retrying while its peer is away, on its
  // own thread; returns its last answer.
  std::thread StepRankZero(int64_t next, absl::StatusOr<StepResult>* answer) {
    return std::thread([this, next, answer] {
      WriteGradients(0, next);
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      do {
        *answer = client(0).Step(next);
        if (answer->ok() || absl::IsDataLoss(answer->status()) ||
            absl::IsInvalidArgument(answer->status())) {
          return;
        }
        absl::SleepFor(absl::Milliseconds(50));
      } while (absl::Now() < deadline);
    });
  }

  // Rank 1's step `step`, retried while the error is transient.
  absl::StatusOr<StepResult> StepRankOne(int64_t step) {
    WriteGradients(1, step);
    absl::StatusOr<StepResult> answer;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    do {
      answer = client(1).Step(step);
      if (answer.ok() || !(absl::IsUnavailable(answer.status()) ||
                           absl::IsAborted(answer.status()) ||
                           absl::IsDeadlineExceeded(answer.status()))) {
        return answer;
      }
      absl::SleepFor(absl::Milliseconds(50));
    } while (absl::Now() < deadline);
    return answer;
  }

  std::optional<ReferenceModel> reference_;
  SavedTrainer saved_;
};

TEST_F(TrainerResumeTest, AStepItsWorkerCommittedIsRepairedExactly) {
  ASSERT_NO_FATAL_FAILURE(StepThreeSavingRankOneAfterTwo(Model(false)));
  ASSERT_TRUE(RestartTrainerFrom(1, saved_, /*resume=*/true).ok());
  absl::StatusOr<StepResult> zero;
  std::thread rank0 = StepRankZero(4, &zero);
  const absl::StatusOr<StepResult> three = StepRankOne(3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_TRUE(three->already_applied);
  EXPECT_TRUE(three->repaired);
  EXPECT_TRUE(three->adamw_applied);
  const absl::StatusOr<StepResult> four = StepRankOne(4);
  rank0.join();
  ASSERT_TRUE(four.ok()) << four.status();
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_FALSE(four->already_applied);
  ASSERT_TRUE(reference_->Step(4).ok());
  ExpectMatchesReference(*reference_, kTolerance);
}

TEST_F(TrainerResumeTest, StateTwoStepsOldIsDataLossNamingIt) {
  ASSERT_NO_FATAL_FAILURE(StepThreeSavingRankOneAfterTwo(Model(false)));
  SavedTrainer older = saved_;
  older.step = 1;  // says it holds step 1 only
  ASSERT_TRUE(RestartTrainerFrom(1, older, /*resume=*/true).ok());
  absl::StatusOr<StepResult> zero;
  std::thread rank0 = StepRankZero(4, &zero);
  const absl::StatusOr<StepResult> two = StepRankOne(2);
  rank0.join();
  ASSERT_FALSE(two.ok());
  EXPECT_TRUE(absl::IsDataLoss(two.status())) << two.status();
  EXPECT_TRUE(absl::StrContains(two.status().message(),
                                "resumed from state saved after step 1"))
      << two.status();
  EXPECT_TRUE(
      absl::StrContains(two.status().message(), "more than one step behind"))
      << two.status();
  EXPECT_TRUE(absl::StrContains(two.status().message(), "saved after step 3"))
      << two.status();
}

TEST_F(TrainerResumeTest, RowsNoOtherTrainerHoldsAreDataLossNamingThem) {
  ASSERT_NO_FATAL_FAILURE(StepThreeSavingRankOneAfterTwo(Model(true)));
  ASSERT_TRUE(RestartTrainerFrom(1, saved_, /*resume=*/true).ok());
  absl::StatusOr<StepResult> zero;
  std::thread rank0 = StepRankZero(4, &zero);
  const absl::StatusOr<StepResult> three = StepRankOne(3);
  rank0.join();
  ASSERT_FALSE(three.ok());
  EXPECT_TRUE(absl::IsDataLoss(three.status())) << three.status();
  EXPECT_TRUE(
      absl::StrContains(three.status().message(), "keeps only its rows"))
      << three.status();
}

TEST_F(TrainerResumeTest, ATrainerThatDoesNotSayIsNeverAnsweredOk) {
  ASSERT_NO_FATAL_FAILURE(StepThreeSavingRankOneAfterTwo(Model(false)));
  ASSERT_TRUE(RestartTrainerFrom(1, saved_, /*resume=*/false).ok());
  const absl::StatusOr<StepResult> three = StepRankOne(3);
  ASSERT_FALSE(three.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(three.status())) << three.status();
  EXPECT_TRUE(
      absl::StrContains(three.status().message(), "had already applied step 3"))
      << three.status();
}

}  // namespace
}  // namespace muonps
