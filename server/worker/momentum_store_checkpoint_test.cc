// MomentumStore's checkpoints on host memory: a staged step written when
// due, before it may commit, and restored by the rule (the job's step, never
// another), all or nothing for a checkpoint the RPC names.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/metrics.h"
#include "gtest/gtest.h"
#include "server/worker/checkpoint_store.h"
#include "server/worker/momentum_store.h"
#include "server/worker/momentum_store_test_fixture.h"

namespace muonps {
namespace worker {
namespace {

TEST_F(MomentumStoreTest, CheckpointsAreTakenWhenDueAndRestoredAsOfTheirStep) {
  const std::string dir = TempDir("due");
  MetricsRegistry metrics;
  {
    MomentumStore store("w0", &ops_);
    EXPECT_EQ(store.RequestCheckpoint().status().code(),
              absl::StatusCode::kFailedPrecondition);  // not enabled
    store.EnableCheckpoints(&metrics);
    ASSERT_NO_FATAL_FAILURE(
        Install(store, Layout(1, {{0, 0}, {0, 1}, {1, 0}}), false));
    EXPECT_EQ(store.RequestCheckpoint().status().code(),
              absl::StatusCode::kFailedPrecondition);  // no directory
    ASSERT_NO_FATAL_FAILURE(Install(
        store, Layout(2, {{0, 0}, {0, 1}, {1, 0}}, dir, /*every=*/2), false));
    // Nothing staged: a due step cannot be written, and says so.
    const absl::Status unstaged = store.PersistStaged(4);
    EXPECT_EQ(unstaged.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(unstaged.message().find("step 4"), std::string::npos) << unstaged;
    // Stack 0 holds a/0 and a/1, stack 1 holds b: a/1's staged step
    // computed none.
    Stage(store, 0, 1);
    Stage(store, 1, 3);
    store.installed().stacks[0].next_has_momentum[1] = false;
    ASSERT_TRUE(store.PersistStaged(3).ok());  // not due: nothing written
    EXPECT_EQ(store.last_checkpoint_step(), -1);
    EXPECT_FALSE(store.SurvivesAKill(3));
    ASSERT_TRUE(store.PersistStaged(4).ok());  // written before it returns
    EXPECT_EQ(store.last_checkpoint_step(), 4);
    EXPECT_TRUE(store.SurvivesAKill(4));
    EXPECT_FALSE(store.SurvivesAKill(3));
    absl::StatusOr<LoadedCheckpoint> written = LoadCheckpoint(dir + "/w0", 4);
    ASSERT_TRUE(written.ok()) << written.status();
    ASSERT_EQ(written->tensors.size(), 2u);  // a/1 holds no momentum
    EXPECT_EQ(written->tensors[0], Values(6, 1));
    EXPECT_EQ(written->tensors[1], Values(8, 3));
    // Its redo in the same version is not written again.
    std::filesystem::remove_all(dir + "/w0");
    ASSERT_TRUE(store.PersistStaged(4).ok());
    EXPECT_FALSE(std::filesystem::exists(dir + "/w0"));
    store.CommitStaged();
    // Asked for: the next step staged, due or not.
    ASSERT_EQ(*store.RequestCheckpoint(), 4);
    Stage(store, 0, 1);
    Stage(store, 1, 3);
    store.installed().stacks[0].next_has_momentum[1] = false;
    ASSERT_TRUE(store.PersistStaged(5).ok());
    EXPECT_EQ(store.last_checkpoint_step(), 5);
    store.CommitStaged();
  }
  // A restarted worker (nothing committed) takes the newest step, 5.
  MomentumStore restarted("w0", &ops_);
  restarted.EnableCheckpoints(&metrics);
  ASSERT_NO_FATAL_FAILURE(
      Install(restarted, Layout(3, {{0, 0}, {0, 1}, {1, 0}}, dir)));
  ASSERT_TRUE(restarted.RestoreMissing(-1).ok());
  EXPECT_EQ(restarted.restored_step(), 5);
  EXPECT_TRUE(restarted.SurvivesAKill(5));
  EXPECT_FALSE(restarted.SurvivesAKill(6));
  EXPECT_EQ(*restarted.Get("a", 0), Values(6, 1));
  EXPECT_EQ(*restarted.Get("b", 0), Values(8, 3));
  EXPECT_FALSE(restarted.Get("a", 1).ok());  // in no checkpoint
  EXPECT_NE(metrics.RenderText().find(
                "muonps_worker_momentum_restores_total{result=\"restored\"} 2"),
            std::string::npos);
  // Its trainer asks for step 9, not 6: the restored momentum is of
  // another step, so it starts from zero, counted as resets.
  restarted.CheckMomentumStep(9);
  EXPECT_EQ(restarted.TakeResets(), 2);
  EXPECT_EQ(restarted.TakeResets(), 0);
  EXPECT_EQ(restarted.resets_total(), 2);
  EXPECT_FALSE(restarted.Get("a", 0).ok());
  // A worker whose job is at step 7 finds only step 5: left at zero.
  MomentumStore later("w1", &ops_);
  later.EnableCheckpoints(nullptr);
  ASSERT_NO_FATAL_FAILURE(Install(later, Layout(3, {{0, 0}}, dir)));
  ASSERT_TRUE(later.RestoreMissing(7).ok());
  EXPECT_FALSE(later.Get("a", 0).ok());
  EXPECT_EQ(later.restored_step(), -1);
  EXPECT_FALSE(later.SurvivesAKill(7));
  // A job that allows a momentum reset goes on after a kill at any step.
  MomentumStacks resettable = Layout(4, {{0, 0}}, dir);
  resettable.allow_momentum_reset = true;
  ASSERT_NO_FATAL_FAILURE(Install(later, std::move(resettable)));
  EXPECT_TRUE(later.SurvivesAKill(7));
}

// Momentum as of an older step than the one before the step staged (handed
// over by a worker that missed a step, or restored from an older
// checkpoint) is never stepped: it is read again from the checkpoint of
// the step before, or starts from zero counted as a reset.
TEST_F(MomentumStoreTest, AStepStagesOnlyOnMomentumOfTheStepBefore) {
  const std::string dir = TempDir("as_of");
  MomentumStore store("w0", &ops_);
  store.EnableCheckpoints(nullptr);
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}}, dir, 1)));
  for (int64_t step = 1; step <= 2; ++step) {
    store.CheckMomentumStep(step);
    Stage(store, 0, 10.0f * step, step);
    ASSERT_TRUE(store.PersistStaged(step).ok());
    store.CommitStaged();
  }
  EXPECT_EQ(*store.Get("a", 0), Values(6, 20));
  // Momentum of step 1 where the job is at step 2.
  absl::StatusOr<CheckedMomentum> older = store.ReadCheckpoint(dir, 1);
  ASSERT_TRUE(older.ok()) << older.status();
  ASSERT_TRUE(store.Write(*std::move(older)).ok());
  EXPECT_EQ(*store.Get("a", 0), Values(6, 10));
  store.CheckMomentumStep(3);
  EXPECT_EQ(*store.Get("a", 0), Values(6, 20));  // the checkpoint of step 2
  EXPECT_EQ(store.TakeResets(), 0);
  // No checkpoint of step 4: zero, counted.
  older = store.ReadCheckpoint(dir, 1);
  ASSERT_TRUE(older.ok());
  ASSERT_TRUE(store.Write(*std::move(older)).ok());
  store.CheckMomentumStep(5);
  EXPECT_EQ(store.TakeResets(), 1);
  EXPECT_EQ(store.Get("a", 0).status().code(), absl::StatusCode::kNotFound);
  // Written by a caller (the trainer's own state): valid for any step.
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 40)));
  store.CheckMomentumStep(9);
  EXPECT_EQ(store.TakeResets(), 0);
  EXPECT_EQ(*store.Get("a", 0), Values(6, 40));
}

TEST_F(MomentumStoreTest, ACheckpointRestoresEveryOwnedExpertOrNothing) {
  const std::string dir = TempDir("restore");
  MomentumStore store("w0", &ops_);
  store.EnableCheckpoints(nullptr);
  EXPECT_EQ(store.ReadCheckpoint(dir, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);  // no version yet
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}}, dir, 1)));
  Stage(store, 0, 1);
  ASSERT_TRUE(store.PersistStaged(1).ok());
  store.CommitStaged();
  EXPECT_EQ(store.ReadCheckpoint("relative", 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.ReadCheckpoint(dir, -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.ReadCheckpoint(dir, 2).status().code(),
            absl::StatusCode::kNotFound);  // no checkpoint of step 2
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(2, {{0, 0}, {1, 0}}, dir, 1)));
  EXPECT_EQ(store.ReadCheckpoint(dir, 1).status().code(),
            absl::StatusCode::kNotFound);  // b is in none
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(3, {{0, 0}}, dir, 1)));
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 40)));
  absl::StatusOr<CheckedMomentum> read = store.ReadCheckpoint(dir, 1);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*store.Write(std::move(*read)), 1);
  EXPECT_EQ(*store.Get("a", 0), Values(6, 1));
  EXPECT_EQ(store.restored_step(), 1);
  // Read for one version, written in another: refused.
  read = store.ReadCheckpoint(dir, 1);
  ASSERT_TRUE(read.ok());
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(4, {{0, 0}}, dir, 1)));
  EXPECT_EQ(store.Write(std::move(*read)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace worker
}  // namespace muonps
