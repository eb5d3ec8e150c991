// MomentumStore on host memory (CpuDeviceOps): one expert's reads and
// writes, the staged step's swap, momentum that stays, moves away and comes
// back across versions, stacks allocated with no lock held, and checkpoints
// taken, written and restored by the rule (the job's step, never another).
#include "server/worker/momentum_store.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/metrics.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

namespace fs = std::filesystem;

// "a": two 2 x 3 experts, "b": one 4 x 2 matrix. Version `version` gives
// this worker (rank 0) the items listed, each shape in a stack of its own.
MomentumStacks Layout(int64_t version,
                      const std::vector<scheduler::ItemRef>& owned,
                      const std::string& checkpoint_dir = "",
                      int64_t checkpoint_every = 0) {
  MomentumStacks layout;
  layout.version = version;
  layout.rank = 0;
  layout.matrices = {{.name = "a", .rows = 2, .cols = 3, .experts = 2},
                     {.name = "b", .rows = 4, .cols = 2, .experts = 1}};
  layout.owners = {{1, 1}, {1}};
  MomentumStack a, b;
  a.rows = 2, a.cols = 3, b.rows = 4, b.cols = 2;
  for (const scheduler::ItemRef& item : owned) {
    layout.owners[item.matrix][item.expert] = 0;
    (item.matrix == 0 ? a : b).items.push_back(item);
  }
  if (!a.items.empty()) layout.stacks.push_back(std::move(a));
  if (!b.items.empty()) layout.stacks.push_back(std::move(b));
  layout.checkpoint_dir = checkpoint_dir;
  layout.checkpoint_every = checkpoint_every;
  return layout;
}

std::vector<float> Values(int64_t count, float base) {
  std::vector<float> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = base + 0.25f * i;
  return v;
}

std::string TempDir(const std::string& name) {
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/momentum_store_", name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

class MomentumStoreTest : public ::testing::Test {
 protected:
  void Install(MomentumStore& store, MomentumStacks layout,
               bool carry_staged = false) {
    absl::StatusOr<PreparedMomentum> prepared =
        store.Prepare(std::move(layout));
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    const absl::Status installed =
        store.Install(std::move(*prepared), carry_staged);
    ASSERT_TRUE(installed.ok()) << installed;
  }
  void Set(MomentumStore& store, const std::string& matrix, int64_t expert,
           std::vector<float> values) {
    absl::StatusOr<CheckedMomentum> checked =
        store.Check(matrix, expert, std::move(values));
    ASSERT_TRUE(checked.ok()) << checked.status();
    ASSERT_TRUE(store.Write(std::move(*checked), -1).ok());
  }
  // Stages `values` as the new momentum of every slot of stack `stack`.
  void Stage(MomentumStore& store, int stack, float base) {
    MomentumStack& s = store.installed().stacks[stack];
    for (size_t slot = 0; slot < s.items.size(); ++slot) {
      const std::vector<float> v = Values(s.floats(), base + slot);
      std::copy(v.begin(), v.end(), s.next_at(static_cast<int>(slot)));
    }
    s.next_has_momentum.assign(s.items.size(), true);
    s.next_valid = true;
  }

  // Runs the installed version's handover on a one-rank transport, as a
  // worker alone in its plan does before the version's first step.
  void HandOver(MomentumStore& store, int64_t last_committed = -1) {
    auto world = transport::ConnectLoopbackWorld(
        1, static_cast<uint64_t>(store.version()),
        transport::LoopbackOptions());
    ASSERT_TRUE(world.ok()) << world.status();
    absl::StatusOr<std::unique_ptr<kernels::FloatBuffer>> control =
        ops_.Allocate(1024, "control");
    ASSERT_TRUE(control.ok());
    bool transport_ok = false;
    const absl::Status handed =
        store.HandOver(*(*world)[0], control->get(), last_committed,
                       absl::Seconds(10), &transport_ok);
    EXPECT_TRUE(transport_ok);
    ASSERT_TRUE(handed.ok()) << handed;
  }

  kernels::CpuDeviceOps ops_;
};

TEST_F(MomentumStoreTest, OneExpertRoundTripsAndOnlyOwnedFiniteValuesGoIn) {
  MomentumStore store("w0", &ops_);
  EXPECT_EQ(store.version(), -1);
  EXPECT_EQ(store.Check("a", 0, Values(6, 1)).status().code(),
            absl::StatusCode::kNotFound);  // no version yet
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}, {1, 0}})));
  EXPECT_EQ(store.version(), 1);
  // Owned, never stepped: nothing to read yet.
  EXPECT_EQ(store.Get("a", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get("a", 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Get("c", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.Check("a", 1, Values(6, 1)).status().code(),
            absl::StatusCode::kNotFound);  // owned elsewhere
  EXPECT_EQ(store.Check("a", 0, Values(5, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> bad = Values(6, 1);
  bad[3] = std::nanf("");
  EXPECT_EQ(store.Check("a", 0, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 1)));
  ASSERT_NO_FATAL_FAILURE(Set(store, "b", 0, Values(8, 9)));
  EXPECT_EQ(*store.Get("a", 0), Values(6, 1));
  EXPECT_EQ(*store.Get("b", 0), Values(8, 9));
}

TEST_F(MomentumStoreTest, CommitSwapsTheStagedMomentumInAndDropForgetsIt) {
  MomentumStore store("w0", &ops_);
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}, {0, 1}})));
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 1)));
  ASSERT_NO_FATAL_FAILURE(Stage(store, 0, 50));
  store.DropStaged();
  store.CommitStaged();  // nothing staged any more
  EXPECT_EQ(*store.Get("a", 0), Values(6, 1));
  EXPECT_FALSE(store.Get("a", 1).ok());
  ASSERT_NO_FATAL_FAILURE(Stage(store, 0, 50));
  store.CommitStaged();
  EXPECT_EQ(*store.Get("a", 0), Values(6, 50));
  EXPECT_EQ(*store.Get("a", 1), Values(6, 51));
  // A write drops what is staged: a restore starts from what it wrote.
  ASSERT_NO_FATAL_FAILURE(Stage(store, 0, 70));
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 1, Values(6, 2)));
  store.CommitStaged();
  EXPECT_EQ(*store.Get("a", 0), Values(6, 50));
  EXPECT_EQ(*store.Get("a", 1), Values(6, 2));
}

TEST_F(MomentumStoreTest, MomentumStaysMovesAwayAndComesBackAcrossVersions) {
  MomentumStore store("w0", &ops_);
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}, {0, 1}, {1, 0}})));
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 1)));
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 1, Values(6, 2)));
  ASSERT_NO_FATAL_FAILURE(Set(store, "b", 0, Values(8, 3)));
  // Momentum a version holds is announced to the next one's handover once
  // its own handover ran.
  ASSERT_NO_FATAL_FAILURE(HandOver(store));
  // a/0 moves away; a/1 and b stay (in other slots).
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(2, {{1, 0}, {0, 1}})));
  EXPECT_EQ(store.installed().slot(0, 1).slot, 0);
  EXPECT_EQ(*store.Get("a", 1), Values(6, 2));
  EXPECT_EQ(*store.Get("b", 0), Values(8, 3));
  EXPECT_EQ(store.Get("a", 0).status().code(), absl::StatusCode::kNotFound);
  // Back before any handover ran: from what was kept to hand over.
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(3, {{0, 0}, {0, 1}})));
  EXPECT_EQ(*store.Get("a", 0), Values(6, 1));
  EXPECT_EQ(*store.Get("a", 1), Values(6, 2));
  EXPECT_EQ(store.Get("b", 0).status().code(), absl::StatusCode::kNotFound);
  // The same version again keeps everything.
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(3, {{0, 0}, {0, 1}})));
  EXPECT_EQ(*store.Get("a", 0), Values(6, 1));
  // Alone in the plan, b's previous owner (this worker, which last held it
  // in version 1) hands it to itself; nothing is lost, nothing reset.
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(4, {{0, 0}, {0, 1}, {1, 0}})));
  ASSERT_NO_FATAL_FAILURE(HandOver(store));
  EXPECT_TRUE(store.handover_failed().ok());
  EXPECT_EQ(store.TakeResets(), 0);
  EXPECT_EQ(*store.Get("b", 0), Values(8, 3));
}

TEST_F(MomentumStoreTest, LostMomentumFailsTheVersionUnlessResetsAreAllowed) {
  MomentumStore store("w0", &ops_);
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}})));
  ASSERT_NO_FATAL_FAILURE(HandOver(store));  // before the job's first step
  // b had an owner that is gone (not this worker), and the job stepped.
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(2, {{0, 0}, {1, 0}})));
  auto world =
      transport::ConnectLoopbackWorld(1, 2, transport::LoopbackOptions());
  ASSERT_TRUE(world.ok());
  auto control = ops_.Allocate(1024, "control");
  bool transport_ok = false;
  const absl::Status lost = store.HandOver(*(*world)[0], control->get(), 0,
                                           absl::Seconds(10), &transport_ok);
  EXPECT_TRUE(transport_ok);
  EXPECT_EQ(lost.code(), absl::StatusCode::kFailedPrecondition) << lost;
  EXPECT_NE(lost.message().find("\"b\""), std::string::npos) << lost;
  EXPECT_EQ(store.handover_failed().code(),
            absl::StatusCode::kFailedPrecondition);
  // The job allows resets: b starts from zero, counted.
  MomentumStacks allowing = Layout(3, {{0, 0}, {1, 0}});
  allowing.allow_momentum_reset = true;
  ASSERT_NO_FATAL_FAILURE(Install(store, std::move(allowing)));
  EXPECT_TRUE(store.handover_failed().ok());
  ASSERT_NO_FATAL_FAILURE(HandOver(store, 0));
  EXPECT_EQ(store.TakeResets(), 1);
  EXPECT_EQ(store.resets_total(), 1);
}

TEST_F(MomentumStoreTest, AStepStagedInDoubtComesAlongToTheNextVersion) {
  MomentumStore store("w0", &ops_);
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}, {0, 1}})));
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 1)));
  ASSERT_NO_FATAL_FAILURE(Stage(store, 0, 50));
  ASSERT_NO_FATAL_FAILURE(
      Install(store, Layout(2, {{0, 1}, {0, 0}}), /*carry_staged=*/true));
  EXPECT_EQ(*store.Get("a", 0), Values(6, 1));  // not committed yet
  store.CommitStaged();
  EXPECT_EQ(*store.Get("a", 0), Values(6, 50));
  EXPECT_EQ(*store.Get("a", 1), Values(6, 51));
}

TEST_F(MomentumStoreTest, AVersionPreparedBeforeAnotherWasInstalledIsRefused) {
  MomentumStore store("w0", &ops_);
  absl::StatusOr<PreparedMomentum> first = store.Prepare(Layout(1, {{0, 0}}));
  absl::StatusOr<PreparedMomentum> second = store.Prepare(Layout(2, {{0, 1}}));
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(store.Install(std::move(*first), false).ok());
  EXPECT_EQ(store.Install(std::move(*second), false).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.version(), 1);
}

// CpuDeviceOps whose Allocate, once armed, says so and waits to be let go.
class GatedOps : public kernels::DeviceOps {
 public:
  absl::Notification entered, release;
  bool armed = false;

  Device device() const override { return ops_.device(); }
  Stream stream() const override { return ops_.stream(); }
  Stream compute_stream() const override { return ops_.compute_stream(); }
  absl::StatusOr<int> Mark(Stream s) override { return ops_.Mark(s); }
  absl::Status WaitForMark(Stream s, int mark) override {
    return ops_.WaitForMark(s, mark);
  }
  absl::StatusOr<std::vector<double>> MarkTimesMs() override {
    return ops_.MarkTimesMs();
  }
  void ClearMarks() override { ops_.ClearMarks(); }
  absl::StatusOr<std::unique_ptr<kernels::FloatBuffer>> Allocate(
      int64_t count, const char* what) override {
    if (armed && !entered.HasBeenNotified()) {
      entered.Notify();
      release.WaitForNotification();
    }
    return ops_.Allocate(count, what);
  }
  absl::Status Copy(float* dst, const float* src, int64_t count,
                    Stream s) override {
    return ops_.Copy(dst, src, count, s);
  }
  absl::Status ToFloat(float* dst, const void* src, DType dtype, int64_t count,
                       Stream s) override {
    return ops_.ToFloat(dst, src, dtype, count, s);
  }
  absl::Status FromFloat(void* dst, DType dtype, const float* src,
                         int64_t count, Stream s) override {
    return ops_.FromFloat(dst, dtype, src, count, s);
  }
  absl::Status Scale(float* data, int64_t count, float factor,
                     Stream s) override {
    return ops_.Scale(data, count, factor, s);
  }
  absl::Status ApplyScaled(void* param, DType dtype, const float* update,
                           int64_t count, float decay, float step,
                           Stream s) override {
    return ops_.ApplyScaled(param, dtype, update, count, decay, step, s);
  }
  absl::StatusOr<std::vector<int64_t>> FirstNonFinite(
      absl::Span<const kernels::FloatSpan> spans, Stream s) override {
    return ops_.FirstNonFinite(spans, s);
  }
  absl::Status Synchronize(Stream s) override { return ops_.Synchronize(s); }

 private:
  // Runs the installed version's handover on a one-rank transport, as a
  // worker alone in its plan does before the version's first step.
  void HandOver(MomentumStore& store, int64_t last_committed = -1) {
    auto world = transport::ConnectLoopbackWorld(
        1, static_cast<uint64_t>(store.version()),
        transport::LoopbackOptions());
    ASSERT_TRUE(world.ok()) << world.status();
    absl::StatusOr<std::unique_ptr<kernels::FloatBuffer>> control =
        ops_.Allocate(1024, "control");
    ASSERT_TRUE(control.ok());
    bool transport_ok = false;
    const absl::Status handed =
        store.HandOver(*(*world)[0], control->get(), last_committed,
                       absl::Seconds(10), &transport_ok);
    EXPECT_TRUE(transport_ok);
    ASSERT_TRUE(handed.ok()) << handed;
  }

  kernels::CpuDeviceOps ops_;
};

TEST_F(MomentumStoreTest, StacksAreAllocatedWithNoLockHeld) {
  GatedOps gated;
  MomentumStore store("w0", &gated);
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}})));
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 1)));
  gated.armed = true;
  absl::StatusOr<PreparedMomentum> prepared;
  std::thread preparing([&] {
    prepared = store.Prepare(Layout(2, {{0, 0}, {0, 1}, {1, 0}}));
  });
  gated.entered.WaitForNotification();
  // While the next version's stacks are being allocated, the store answers.
  absl::Notification answered;
  std::thread reading([&] {
    EXPECT_EQ(store.version(), 1);
    EXPECT_EQ(*store.Get("a", 0), Values(6, 1));
    answered.Notify();
  });
  EXPECT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(10)));
  gated.release.Notify();
  preparing.join();
  reading.join();
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  ASSERT_TRUE(store.Install(std::move(*prepared), false).ok());
  EXPECT_EQ(*store.Get("a", 0), Values(6, 1));
}

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
    ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 1)));
    ASSERT_NO_FATAL_FAILURE(Set(store, "b", 0, Values(8, 3)));
    EXPECT_FALSE(store.TakeSnapshot(3).has_value());  // not due
    std::optional<CheckpointSnapshot> due = store.TakeSnapshot(4);
    ASSERT_TRUE(due.has_value());
    EXPECT_EQ(due->step, 4);
    ASSERT_EQ(due->tensors.size(), 2u);               // a/1 holds no momentum
    EXPECT_FALSE(store.TakeSnapshot(4).has_value());  // taken already
    store.Submit(std::move(*due));
    ASSERT_TRUE(store.WaitForCheckpoint().ok());
    EXPECT_EQ(store.last_checkpoint_step(), 4);
    // Asked for: the next committed step, due or not.
    ASSERT_EQ(*store.RequestCheckpoint(), 4);
    std::optional<CheckpointSnapshot> asked = store.TakeSnapshot(5);
    ASSERT_TRUE(asked.has_value());
    store.Submit(std::move(*asked));
    ASSERT_TRUE(store.WaitForCheckpoint().ok());
    EXPECT_EQ(store.last_checkpoint_step(), 5);
  }
  // A restarted worker (nothing committed) takes the newest step, 5.
  MomentumStore restarted("w0", &ops_);
  restarted.EnableCheckpoints(&metrics);
  ASSERT_NO_FATAL_FAILURE(
      Install(restarted, Layout(3, {{0, 0}, {0, 1}, {1, 0}}, dir)));
  ASSERT_TRUE(restarted.RestoreMissing(-1).ok());
  EXPECT_EQ(restarted.restored_step(), 5);
  EXPECT_EQ(*restarted.Get("a", 0), Values(6, 1));
  EXPECT_EQ(*restarted.Get("b", 0), Values(8, 3));
  EXPECT_FALSE(restarted.Get("a", 1).ok());  // in no checkpoint
  EXPECT_NE(metrics.RenderText().find(
                "muonps_worker_momentum_restores_total{result=\"restored\"} 2"),
            std::string::npos);
  // Its trainer asks for step 9, not 6: the restored momentum is of
  // another step, so it starts from zero, counted as resets.
  restarted.CheckRestoredStep(9, -1);
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
}

TEST_F(MomentumStoreTest, ACheckpointRestoresEveryOwnedExpertOrNothing) {
  const std::string dir = TempDir("restore");
  MomentumStore store("w0", &ops_);
  store.EnableCheckpoints(nullptr);
  EXPECT_EQ(store.ReadCheckpoint(dir, 1).status().code(),
            absl::StatusCode::kFailedPrecondition);  // no version yet
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(1, {{0, 0}}, dir, 1)));
  ASSERT_NO_FATAL_FAILURE(Set(store, "a", 0, Values(6, 1)));
  std::optional<CheckpointSnapshot> snapshot = store.TakeSnapshot(1);
  ASSERT_TRUE(snapshot.has_value());
  store.Submit(std::move(*snapshot));
  ASSERT_TRUE(store.WaitForCheckpoint().ok());
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
  EXPECT_EQ(*store.Write(std::move(*read), 3), 1);
  EXPECT_EQ(*store.Get("a", 0), Values(6, 1));
  EXPECT_EQ(store.restored_step(), 1);
  // Read for one version, written in another: refused.
  read = store.ReadCheckpoint(dir, 1);
  ASSERT_TRUE(read.ok());
  ASSERT_NO_FATAL_FAILURE(Install(store, Layout(4, {{0, 0}}, dir, 1)));
  EXPECT_EQ(store.Write(std::move(*read), 3).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace worker
}  // namespace muonps
