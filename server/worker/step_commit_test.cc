// CommitStaged's writes into a trainer's parameters: the AdamW means first,
// then the matrices in the order the trainer bound them, with the
// parameters' progress word (SignalParameters) never ahead of the writes.
#include "server/worker/step_commit.h"

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "server/worker/step_control.h"
#include "server/worker/step_state.h"
#include "server/worker/trainer_buffers.h"
#include "transport/loopback_ranks.h"

namespace muonps {
namespace worker {
namespace {

// Host buffers that record each signal with what the parameters held then.
class RecordingBuffers final : public TrainerBuffers {
 public:
  // `params[m]`: job matrix m's parameter, all ones until written.
  explicit RecordingBuffers(const std::vector<std::vector<float>>* params)
      : params_(params) {}
  Device device() const override { return kHostDevice; }
  absl::StatusOr<LentTensor> Map(const TensorBinding&, int64_t,
                                 int64_t) override {
    return absl::UnimplementedError("not mapped");
  }
  absl::Status SignalParameters(Stream, int64_t step_id,
                                uint32_t written) override {
    Signal s{step_id, written, {}};
    for (const std::vector<float>& p : *params_) {
      s.whole.push_back(p.front() != 1.0f && p.back() != 1.0f);
    }
    signals.push_back(std::move(s));
    return absl::OkStatus();
  }
  absl::Status SignalTrainer(Stream, int64_t step_id) override {
    released.push_back(step_id);
    return absl::OkStatus();
  }

  struct Signal {
    int64_t step_id;
    uint32_t written;
    std::vector<bool> whole;  // by job matrix: every element written
  };
  std::vector<Signal> signals;
  std::vector<int64_t> released;

 private:
  const std::vector<std::vector<float>>* params_;
};

class CommitOrderTest : public ::testing::Test {
 protected:
  // Three job matrices of 2 Mi fp32 elements (8 MiB: the word moves after
  // each), bound by the trainer in the order 2, 0, 1.
  void SetUp() override {
    constexpr int64_t kElements = int64_t{2} << 20;
    params_.assign(3, std::vector<float>(kElements, 1.0f));
    auto buffers = std::make_unique<RecordingBuffers>(&params_);
    recording_ = buffers.get();
    trainer_.buffers = std::move(buffers);
    trainer_.bound_position = {1, 2, 0};
    trainer_.matrices.resize(3);
    absl::StatusOr<kernels::TypedBuffer> updates =
        kernels::TypedBuffer::Allocate(ops_, DType::kFloat32, 3 * kElements,
                                       "updates");
    ASSERT_TRUE(updates.ok()) << updates.status();
    trainer_.updates = *std::move(updates);
    for (int m = 0; m < 3; ++m) {
      trainer_.matrices[m].param = params_[m].data();
      trainer_.matrices[m].param_elements = kElements;
      trainer_.matrices[m].elements = kElements;
      trainer_.matrices[m].kept_at = m * kElements * 4;
      float* update = static_cast<float*>(trainer_.updates.at(m * kElements));
      for (int64_t i = 0; i < kElements; ++i) update[i] = 1.0f;
      // Each matrix in two row ranges, staged in job order.
      for (int half = 0; half < 2; ++half) {
        ParamApply a;
        a.matrix = m;
        a.first = half * kElements / 2;
        a.count = kElements / 2;
        a.staged_at = m * kElements + a.first;
        a.decay = 1.0f;
        a.step = -0.5f;
        ledger_.staged.applies.push_back(a);
      }
    }
    ledger_.staged.step_id = 7;
  }

  std::vector<std::vector<float>> params_;
  kernels::CpuDeviceOps ops_;
  AttachedTrainer trainer_;
  RecordingBuffers* recording_ = nullptr;
  StepLedger ledger_{/*instance_id=*/1};
  PlanState plan_;
};

TEST_F(CommitOrderTest, WritesInBoundOrderAndTheWordNeverRunsAhead) {
  ASSERT_TRUE(
      CommitStaged(ledger_, plan_, &trainer_, ops_, /*release=*/7).ok());
  for (const std::vector<float>& p : params_) {
    EXPECT_EQ(p.front(), 0.5f);
    EXPECT_EQ(p.back(), 0.5f);
  }
  // 0 before any write, then one matrix at a time in bound order (job
  // matrices 2, 0, 1), then the release.
  ASSERT_EQ(recording_->signals.size(), 4u);
  const std::vector<std::vector<bool>> whole = {{false, false, false},
                                                {false, false, true},
                                                {true, false, true},
                                                {true, true, true}};
  for (uint32_t k = 0; k < 4; ++k) {
    const RecordingBuffers::Signal& s = recording_->signals[k];
    EXPECT_EQ(s.step_id, 7);
    EXPECT_EQ(s.written, k);
    EXPECT_EQ(s.whole, whole[k]) << "at written = " << k;
  }
  EXPECT_EQ(recording_->released, std::vector<int64_t>{7});
  EXPECT_EQ(ledger_.last.load(), 7);
}

TEST_F(CommitOrderTest, AStepTheTrainerDoesNotWaitForMovesNoWord) {
  // Committed by a later round (an in-doubt step): the trainer's stream
  // waits for the step it asked for, which its own SignalTrainer releases.
  ASSERT_TRUE(CommitStaged(ledger_, plan_, &trainer_, ops_).ok());
  EXPECT_TRUE(recording_->signals.empty());
  EXPECT_TRUE(recording_->released.empty());
  EXPECT_EQ(params_[1].front(), 0.5f);
}

// A step decided early has its updates in the parameters already: the
// commit writes none of them again, and says so to the trainer at once.
TEST_F(CommitOrderTest, AStepDecidedEarlyWritesNoParameterAgain) {
  ledger_.staged.early = EarlyApply::kDecided;
  for (ParamApply& a : ledger_.staged.applies) a.applied = true;
  ASSERT_TRUE(
      CommitStaged(ledger_, plan_, &trainer_, ops_, /*release=*/7).ok());
  for (const std::vector<float>& p : params_) EXPECT_EQ(p.front(), 1.0f);
  ASSERT_EQ(recording_->signals.size(), 1u);
  EXPECT_EQ(recording_->signals[0].written, 0u);  // the means
  EXPECT_EQ(recording_->released, std::vector<int64_t>{7});
  EXPECT_EQ(ledger_.last.load(), 7);
}

// Updates applied as they landed are skipped one by one: the commit writes
// the others (a peer's copies) and advances the progress word past both.
TEST_F(CommitOrderTest, TheCommitWritesOnlyWhatWasNotAppliedEarly) {
  ledger_.staged.early = EarlyApply::kUndoable;
  ledger_.staged.applies[0].applied = true;
  ASSERT_TRUE(
      CommitStaged(ledger_, plan_, &trainer_, ops_, /*release=*/7).ok());
  EXPECT_EQ(params_[0].front(), 1.0f);  // applied before: left alone
  EXPECT_EQ(params_[0].back(), 0.5f);
  for (size_t m = 1; m < params_.size(); ++m) {
    EXPECT_NE(params_[m].front(), 1.0f) << m;
  }
  EXPECT_EQ(ledger_.last.load(), 7);
}

// What a step applied early is put back exactly, range by range.
TEST_F(CommitOrderTest, KeptParametersGoBackAsTheyWere) {
  ASSERT_TRUE(trainer_.AllocateKept(ops_).ok());
  const std::vector<std::vector<float>> before = params_;
  const std::vector<ParamApply>& applies = ledger_.staged.applies;
  ASSERT_TRUE(KeepParameters(applies, trainer_, ops_, ops_.stream()).ok());
  ASSERT_TRUE(ApplyUpdates(applies, trainer_, ops_, ops_.stream()).ok());
  EXPECT_NE(params_, before);
  ASSERT_TRUE(RestoreParameters(applies, trainer_, ops_, ops_.stream()).ok());
  EXPECT_EQ(params_, before);
}

// The vote of one worker on a step it decided early: a call cancelled
// since the decision still commits (the parameters hold the step), where
// the same call on a step not decided yet votes no and applies nothing.
TEST_F(CommitOrderTest, ACancelledCallCommitsAStepDecidedEarlyOnly) {
  absl::StatusOr<std::vector<std::unique_ptr<transport::TcpTransport>>> world =
      transport::ConnectLoopbackWorld(1, /*session=*/1,
                                      transport::LoopbackOptions());
  ASSERT_TRUE(world.ok()) << world.status();
  absl::StatusOr<std::unique_ptr<kernels::FloatBuffer>> scratch =
      ops_.Allocate(64, "scratch");
  ASSERT_TRUE(scratch.ok()) << scratch.status();
  ControlChannel control((*world)[0].get(), &ops_, scratch->get(),
                         absl::Seconds(5));
  const StepCancelled cancelled = [] { return true; };
  CommitOutcome out =
      RunCommitPhases(7, absl::OkStatus(), control, 0, 1, {"w0"}, ledger_,
                      plan_, &trainer_, ops_, cancelled, nullptr);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kCancelled) << out.status;
  EXPECT_FALSE(out.committed);
  EXPECT_EQ(params_[0].front(), 1.0f);
  EXPECT_EQ(ledger_.last.load(), -1);

  ledger_.staged.step_id = 7;
  ledger_.staged.early = EarlyApply::kDecided;
  out = RunCommitPhases(7, absl::OkStatus(), control, 0, 1, {"w0"}, ledger_,
                        plan_, &trainer_, ops_, cancelled, nullptr);
  EXPECT_TRUE(out.status.ok()) << out.status;
  EXPECT_TRUE(out.committed);
  EXPECT_EQ(ledger_.last.load(), 7);
}

}  // namespace
}  // namespace worker
}  // namespace muonps
