// MomentumStore on host memory (CpuDeviceOps): one expert's reads and
// writes, the staged step's swap, momentum that stays, moves away and comes
// back across versions, the handover's bookkeeping, and stacks allocated
// with no lock held.
#include "server/worker/momentum_store.h"

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "server/worker/momentum_store_test_fixture.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

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
  absl::Status CopyBytes(void* dst, const void* src, int64_t bytes,
                         Stream s) override {
    return ops_.CopyBytes(dst, src, bytes, s);
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
  absl::Status ApplyScaled(void* param, DType dtype, const void* update,
                           DType update_dtype, int64_t count, float decay,
                           float step, Stream s) override {
    return ops_.ApplyScaled(param, dtype, update, update_dtype, count, decay,
                            step, s);
  }
  absl::Status PrepareFiniteChecks(int64_t count, Stream s) override {
    return ops_.PrepareFiniteChecks(count, s);
  }
  absl::Status CheckFinite(absl::Span<const kernels::FloatSpan> spans,
                           int64_t first, Stream s) override {
    return ops_.CheckFinite(spans, first, s);
  }
  absl::StatusOr<std::vector<int64_t>> FiniteResults(int64_t count,
                                                     Stream s) override {
    return ops_.FiniteResults(count, s);
  }
  absl::Status Synchronize(Stream s) override { return ops_.Synchronize(s); }

 private:
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

}  // namespace
}  // namespace worker
}  // namespace muonps
