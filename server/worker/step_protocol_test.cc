// DecideRound and StepRequestProblem on hand-made headers and requests:
// staged steps commit when some rank committed them, are dropped when the
// rank 0 that ran them is here and did not, and are refused with DATA_LOSS
// when nobody can tell; a restarted worker whose trainer retries a
// committed step is refused too; retries of committed steps run no step;
// fields are named.
#include "server/worker/step_protocol.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace muonps {
namespace worker {
namespace {

const std::vector<std::string> kIds = {"w0", "w1", "w2"};

StepHeader Header(int rank, int64_t step, int64_t last, uint64_t instance = 0) {
  StepHeader h{};
  h.step_id = step;
  h.last_step = last;
  h.staged_step = -1;
  h.instance = instance == 0 ? 100 + rank : instance;
  h.trainer_rank = rank;
  h.trainer_count = 3;
  return h;
}

RoundKind KindOf(const RoundDecision& d) {
  return static_cast<RoundKind>(d.kind);
}

std::string Problem(const RoundDecision& d) { return ProblemText(d.problem); }

TEST(DecideRoundTest, EveryTrainerAskingTheSameNewStepRunsIt) {
  const RoundDecision d = DecideRound(
      {Header(0, 5, 4), Header(1, 5, 4), Header(2, 5, 4)}, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kGo);
  EXPECT_EQ(d.step_id, 5);
  EXPECT_EQ(d.committed, 4);
  EXPECT_EQ(d.resolve, 1);
}

TEST(DecideRoundTest, AStepStagedAndCommittedElsewhereCommitsFromStaging) {
  std::vector<StepHeader> h = {Header(0, 5, 5), Header(1, 5, 4),
                               Header(2, 5, 5)};
  h[1].staged_step = 5;
  h[1].staged_decider = 100;
  const RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kNoStep);  // everyone's step is committed
  EXPECT_EQ(d.committed, 5);
  EXPECT_EQ(d.resolve, 1);
}

TEST(DecideRoundTest, AStepStagedThatItsRankZeroDidNotCommitIsRedone) {
  std::vector<StepHeader> h = {Header(0, 5, 4), Header(1, 5, 4),
                               Header(2, 5, 4)};
  h[2].staged_step = 5;
  h[2].staged_decider = 100;  // w0, still here
  const RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kGo);
  EXPECT_EQ(d.committed, 4);  // so w2 drops its staging
  EXPECT_EQ(d.resolve, 1);
}

TEST(DecideRoundTest, AStepStagedWhoseRankZeroRestartedIsDataLoss) {
  std::vector<StepHeader> h = {Header(0, 5, -1, 777), Header(1, 5, 4),
                               Header(2, 5, 4)};
  h[1].staged_step = 5;
  h[1].staged_decider = 100;  // the w0 before its restart
  const RoundDecision d = DecideRound(h, 3, kIds, 777);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kDataLoss));
  EXPECT_EQ(d.resolve, 0);
  EXPECT_TRUE(absl::StrContains(Problem(d), "worker \"w1\" holds step 5"))
      << Problem(d);
}

TEST(DecideRoundTest, ARestartedWorkerRetryingACommittedStepIsDataLoss) {
  const RoundDecision d = DecideRound(
      {Header(0, 5, 5), Header(1, 5, -1), Header(2, 5, 5)}, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(Problem(d), "worker \"w1\" restarted"))
      << Problem(d);
}

TEST(DecideRoundTest, ARestartedWorkerJoiningAtANewStepSteps) {
  const RoundDecision d = DecideRound(
      {Header(0, 6, 5), Header(1, 6, -1), Header(2, 6, 5)}, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kGo);
  EXPECT_EQ(d.step_id, 6);
}

TEST(DecideRoundTest, AWorkerThatLostACommittedStepIsDataLoss) {
  const RoundDecision d = DecideRound(
      {Header(0, 6, 5), Header(1, 6, 4), Header(2, 6, 5)}, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(Problem(d), "worker \"w1\" lost step 5"))
      << Problem(d);
}

TEST(DecideRoundTest, ARetryOfACommittedStepBesideANewStepRunsNone) {
  const RoundDecision d = DecideRound(
      {Header(0, 6, 5), Header(1, 5, 5), Header(2, 6, 5)}, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kNoStep);
  EXPECT_EQ(d.committed, 5);  // w1 answers already_applied; the others go on
}

TEST(DecideRoundTest, DisagreementsAreRejectedNamingTheWorker) {
  std::vector<StepHeader> h = {Header(0, 6, 5), Header(1, 6, 5),
                               Header(2, 7, 5)};
  RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(Problem(d), "worker \"w2\" is at step 7"))
      << Problem(d);
  h[2].step_id = 6;
  h[1].tensors_hash = 9;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_TRUE(absl::StrContains(Problem(d), "different AdamW tensors"))
      << Problem(d);
  h[1].tensors_hash = 0;
  h[2].hyper_hash = 9;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_TRUE(absl::StrContains(Problem(d), "different lr")) << Problem(d);
}

std::vector<scheduler::MatrixSpec> TwoMatrices() {
  std::vector<scheduler::MatrixSpec> m(2);
  m[0].name = "a";
  m[1].name = "b";
  return m;
}

TEST(StepRequestProblemTest, NamesTheField) {
  v1::StepRequest r;
  EXPECT_EQ(StepRequestProblem(r, TwoMatrices()), "");
  r.set_lr(-1);  // the default
  EXPECT_EQ(StepRequestProblem(r, TwoMatrices()), "");
  r.set_lr(-INFINITY);
  EXPECT_TRUE(absl::StartsWith(StepRequestProblem(r, TwoMatrices()), "lr: "));
  r.set_lr(0.1);
  r.set_adamw_lr(NAN);
  EXPECT_TRUE(
      absl::StartsWith(StepRequestProblem(r, TwoMatrices()), "adamw_lr: "));
  r.set_adamw_lr(-1);
  v1::ParamGroup* g = r.add_groups();
  g->set_lr(0.1);
  g->add_matrices("nope");
  EXPECT_EQ(StepRequestProblem(r, TwoMatrices()),
            "groups[0].matrices[0]: \"nope\" is not a matrix of the job");
  g->set_matrices(0, "a");
  v1::ParamGroup* h = r.add_groups();
  h->set_lr(0.2);
  h->add_matrices("b");
  h->add_matrices("a");
  EXPECT_EQ(StepRequestProblem(r, TwoMatrices()),
            "groups[1].matrices[1]: \"a\" is in groups[0] too");
  h->mutable_matrices()->RemoveLast();
  h->set_weight_decay(-0.5);
  EXPECT_TRUE(absl::StartsWith(StepRequestProblem(r, TwoMatrices()),
                               "groups[1].weight_decay: -0.5"));
}

}  // namespace
}  // namespace worker
}  // namespace muonps
