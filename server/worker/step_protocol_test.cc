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
  h.params_step = last;
  h.staged_step = -1;
  h.torn_step = -1;
  h.record_decided = -1;
  h.means_step = last;
  h.full_params = 1;
  h.adopted = instance == 0 ? 0 : 1;  // another instance: it restarted
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

// Updates travel in the precision Newton-Schulz ran in: workers of two
// precisions (a dedicated one among them) cannot step together.
TEST(DecideRoundTest, WorkersOfTwoPrecisionsAreRefusedNamingBoth) {
  std::vector<StepHeader> h = {Header(0, 5, 4), Header(1, 5, 4),
                               Header(2, -1, 4)};
  for (StepHeader& x : h)
    x.update_dtype = static_cast<int32_t>(DType::kBFloat16);
  for (StepHeader& x : h) x.trainer_count = 2;
  h[2].trainer_rank = -1;  // dedicated
  h[2].trainer_count = 0;
  EXPECT_EQ(KindOf(DecideRound(h, 2, kIds, 100)), RoundKind::kGo);
  h[2].update_dtype = static_cast<int32_t>(DType::kFloat32);
  const RoundDecision d = DecideRound(h, 2, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(static_cast<absl::StatusCode>(d.code),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(Problem(d), "\"w2\" moves its updates in fp32"))
      << Problem(d);
  EXPECT_TRUE(absl::StrContains(Problem(d), "\"w0\" in bf16")) << Problem(d);
  EXPECT_TRUE(absl::StrContains(Problem(d), "--precision")) << Problem(d);
  EXPECT_TRUE(absl::StrContains(Problem(d), "nothing was changed"))
      << Problem(d);
}

// Workers must issue the same transfers in the same order: one whose build
// cuts the plan's schedule differently (a rolling upgrade under way) is
// refused, UNAVAILABLE so that the trainers retry until every worker runs
// one build.
TEST(DecideRoundTest, WorkersOfTwoSchedulesAreRefusedForARetry) {
  std::vector<StepHeader> h = {Header(0, 5, 4), Header(1, 5, 4),
                               Header(2, 5, 4)};
  for (StepHeader& x : h) x.schedule_digest = 7;
  EXPECT_EQ(KindOf(DecideRound(h, 3, kIds, 100)), RoundKind::kGo);
  h[1].schedule_digest = 8;
  const RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(static_cast<absl::StatusCode>(d.code),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(Problem(d), "\"w1\" and worker \"w0\" cut"))
      << Problem(d);
  EXPECT_TRUE(absl::StrContains(Problem(d), "one build")) << Problem(d);
  EXPECT_TRUE(absl::StrContains(Problem(d), "nothing was changed"))
      << Problem(d);
}

TEST(ScheduleDigestTest, EqualForOneScheduleAndChangedByAnyCut) {
  std::vector<scheduler::MatrixSpec> matrices(3);
  scheduler::OwnershipPlan plan;
  plan.worker_ids = {"w0", "w1"};
  for (int m = 0; m < 3; ++m) {
    matrices[m].name = "m" + std::to_string(m);
    matrices[m].rows = 4096;
    matrices[m].cols = 4096;
    matrices[m].layer = m;
    plan.matrix_names.push_back(matrices[m].name);
    plan.owners.push_back({0});
  }
  const absl::StatusOr<scheduler::StepSchedule> one =
      scheduler::BuildStepSchedule(matrices, plan, {});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(ScheduleDigest(*one),
            ScheduleDigest(*scheduler::BuildStepSchedule(matrices, plan, {})));
  // Stacks cut elsewhere, a chunk's algorithm, a transfer's owner, the
  // order: each changes it.
  scheduler::StepSchedule changed =
      *scheduler::BuildStepSchedule(matrices, plan, {.stack_bytes = 1});
  EXPECT_NE(ScheduleDigest(changed), ScheduleDigest(*one));
  changed = *one;
  changed.stacks[0].chunks[0].algorithm = NsAlgorithm::kGram;
  EXPECT_NE(ScheduleDigest(changed), ScheduleDigest(*one));
  changed = *one;
  changed.buckets[0].from_owners[0].owner = 1;
  EXPECT_NE(ScheduleDigest(changed), ScheduleDigest(*one));
  changed = *one;
  std::swap(changed.order[0], changed.order[1]);
  EXPECT_NE(ScheduleDigest(changed), ScheduleDigest(*one));
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

// The rank 0 that ran a staged step restarted, and its trainer's step
// record says what it decided: a commit stands (the staging commits), and
// a step above its last decision was never committed (dropped, redone).
TEST(DecideRoundTest, TheDecisionOfARestartedRankZeroComesFromItsRecord) {
  std::vector<StepHeader> h = {Header(0, 5, 4, 777), Header(1, 5, 4),
                               Header(2, 5, 4)};
  h[1].staged_step = 5;
  h[1].staged_decider = 100;  // the w0 before its restart
  h[0].record_decider = 100;
  h[0].record_decided = 4;
  RoundDecision d = DecideRound(h, 3, kIds, 777);
  // w1 drops its staging in a round of its own: the new rank 0 claims the
  // record (kDecider) when it opens a step, and until nobody holds the
  // step of the w0 before it, the record must still name that one.
  EXPECT_EQ(KindOf(d), RoundKind::kNoStep) << Problem(d);
  EXPECT_EQ(d.committed, 4);  // so w1 drops its staging
  EXPECT_EQ(d.resolve, 1);
  // Then step 5 runs.
  h[1].staged_step = -1;
  d = DecideRound(h, 3, kIds, 777);
  EXPECT_EQ(KindOf(d), RoundKind::kGo) << Problem(d);
  EXPECT_EQ(d.step_id, 5);
  // A w0 that claimed the record and died on the first step it opened,
  // before deciding any: its instance with no decision, the step dropped.
  h[1].staged_step = 5;
  h[0].record_decided = -1;
  d = DecideRound(h, 3, kIds, 777);
  EXPECT_EQ(KindOf(d), RoundKind::kNoStep) << Problem(d);
  EXPECT_EQ(d.resolve, 1);
  h[0].record_decided = 4;
  // It decided to commit step 5, and died before applying it: w1 commits
  // from its staging, and w0's trainer, which lacks the step (its record:
  // 4), is repaired from w1's.
  h[0].record_decided = 5;
  d = DecideRound(h, 3, kIds, 777);
  EXPECT_EQ(KindOf(d), RoundKind::kRepair) << Problem(d);
  EXPECT_EQ(d.committed, 5);
  EXPECT_EQ(d.resolve, 1);
  EXPECT_EQ(d.source, 1);
  EXPECT_EQ(d.target, 0);
}

// A trainer whose parameters miss the step its peers committed (its worker
// restarted before applying it) is repaired from one that holds it; not
// when no trainer keeps whole parameters and the step's AdamW means, or
// when it misses more than that step.
TEST(DecideRoundTest, ParametersMissingTheLastStepAreRepairedFromAPeer) {
  std::vector<StepHeader> h = {Header(0, 5, 5), Header(1, 5, 4, 777),
                               Header(2, 5, 5)};
  RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kRepair) << Problem(d);
  EXPECT_EQ(d.source, 0);
  EXPECT_EQ(d.target, 1);
  EXPECT_EQ(d.params, 1);
  EXPECT_EQ(d.means, 1);  // the trainer retries the committed step
  // With unreduced AdamW tensors, the source holds the step's means too.
  for (StepHeader& x : h) x.has_unreduced = 1;
  h[0].means_step = -1;  // w0 restarted after applying it: no means
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kRepair) << Problem(d);
  EXPECT_EQ(d.source, 2);
  EXPECT_EQ(d.target, 0);  // the means alone
  EXPECT_EQ(d.params, 0);
  h[0].means_step = 5;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(d.target, 1);
  EXPECT_EQ(d.params, 1);
  h[0].means_step = -1;
  h[2].means_step = -1;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(Problem(d), "AdamW means")) << Problem(d);
  h = {Header(0, 5, 5), Header(1, 5, 3, 777), Header(2, 5, 5)};
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_TRUE(absl::StrContains(Problem(d), "more than one step behind"))
      << Problem(d);
}

// A restarted worker whose trainer's record says the parameters hold the
// committed step (its predecessor applied it) answers already_applied.
TEST(DecideRoundTest, ARestartedWorkerWhoseRecordHoldsTheStepIsApplied) {
  const RoundDecision d = DecideRound(
      {Header(0, 5, 5), Header(1, 5, 5, 777), Header(2, 5, 5)}, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kNoStep);
  EXPECT_EQ(d.committed, 5);
}

TEST(DecideRoundTest, ParametersHoldingPartOfAStepAreRepairedOrNamed) {
  std::vector<StepHeader> h = {Header(0, 5, 5), Header(1, 5, 4, 777),
                               Header(2, 5, 5)};
  h[1].torn_step = 5;
  RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kRepair) << Problem(d);
  EXPECT_EQ(d.target, 1);
  // Its trainer keeps only its rows of a matrix: nobody else has them.
  h[1].full_params = 0;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(Problem(d),
                                "the parameters of worker \"w1\"'s trainer "
                                "hold part of step 5"))
      << Problem(d);
}

// Part of a step nobody committed (applied before the votes, its worker
// killed before it could put it back; the peers put theirs back): the
// parameters of the committed step come from a peer's trainer, without
// that step's AdamW means (the trainer stepped AdamW on them already and
// retries the next step). Named, with the step to reload from, where no
// peer can send them.
TEST(DecideRoundTest, ParametersHoldingPartOfAStepNeverCommittedAreRepaired) {
  std::vector<StepHeader> h = {Header(0, 6, 5), Header(1, 6, 5, 777),
                               Header(2, 6, 5)};
  for (StepHeader& x : h) x.has_unreduced = 1;
  h[1].torn_step = 6;
  h[0].means_step = -1;  // no means needed from the source
  RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kRepair) << Problem(d);
  EXPECT_EQ(d.committed, 5);
  EXPECT_EQ(d.source, 0);
  EXPECT_EQ(d.target, 1);
  EXPECT_EQ(d.params, 1);
  EXPECT_EQ(d.means, 0);
  // A peer holding part of the step too is no source.
  h[0].torn_step = 6;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kRepair) << Problem(d);
  EXPECT_EQ(d.target, 0);
  EXPECT_EQ(d.source, 2);
  // Every trainer holding part of it: nobody holds step 5 whole.
  h[2].torn_step = 6;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(Problem(d),
                                "the parameters of worker \"w0\"'s trainer "
                                "hold part of step 6"))
      << Problem(d);
  EXPECT_TRUE(absl::StrContains(Problem(d), "step 6 was never committed"))
      << Problem(d);
  EXPECT_TRUE(absl::StrContains(Problem(d), "no trainer that holds step 5"))
      << Problem(d);
  EXPECT_FALSE(absl::StrContains(Problem(d), "AdamW means")) << Problem(d);
  EXPECT_TRUE(absl::StrContains(Problem(d), "saved after step 5"))
      << Problem(d);
  // Rows of a row-sharded matrix (HSDP's): no peer holds the same whole.
  h[0].torn_step = h[2].torn_step = -1;
  h[1].full_params = 0;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_TRUE(absl::StrContains(Problem(d), "keeps only its rows"))
      << Problem(d);
  // Under the torn step, parameters older than the committed one.
  h[1].full_params = 1;
  h[1].params_step = 4;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_TRUE(absl::StrContains(Problem(d), "more than one step behind"))
      << Problem(d);
}

TEST(DecideRoundTest, ARestartedWorkerRetryingACommittedStepIsDataLoss) {
  const RoundDecision d = DecideRound(
      {Header(0, 5, 5), Header(1, 5, -1), Header(2, 5, 5)}, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(Problem(d), "worker \"w1\" restarted"))
      << Problem(d);
  // What to do about it, whole (not cut by the message's size).
  EXPECT_TRUE(absl::StrContains(
      Problem(d),
      "optimizer state saved after step 5 (the workers' momentum: "
      "the job's checkpoint of that step) and go on with step 6"))
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

// A trainer that resumed from its state saved after step 4 while its
// (live) worker committed step 5: its parameters are repaired from a peer,
// whose trainers ask for step 6; more than one step behind, or keeping
// only its rows, it is named.
TEST(DecideRoundTest, ATrainerResumedOneStepBehindIsRepairedFromAPeer) {
  std::vector<StepHeader> h = {Header(0, 6, 5), Header(1, 5, 5),
                               Header(2, 6, 5)};
  h[1].params_step = 4;
  RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kRepair) << Problem(d);
  EXPECT_EQ(d.source, 0);
  EXPECT_EQ(d.target, 1);
  EXPECT_EQ(d.params, 1);
  EXPECT_EQ(d.committed, 5);
  // A resumed trainer is no source for another's repair.
  h[0].params_step = 4;
  h[0].step_id = 5;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kRepair) << Problem(d);
  EXPECT_EQ(d.target, 0);
  EXPECT_EQ(d.source, 2);
  h[0] = Header(0, 6, 5);
  h[1].params_step = 3;
  h[1].step_id = 4;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kDataLoss));
  EXPECT_TRUE(absl::StrContains(
      Problem(d),
      "worker \"w1\"'s trainer resumed from state saved after step 3, and "
      "worker \"w0\" committed step 5; no repair: they hold step 3, more "
      "than one step behind"))
      << Problem(d);
  h[1].params_step = 4;
  h[1].step_id = 5;
  h[1].full_params = 0;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_TRUE(absl::StrContains(Problem(d), "keeps only its rows"))
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
  // Two trainers of one rank: no retry fixes it.
  h[2].hyper_hash = 0;
  h[2].trainer_rank = 1;
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_TRUE(absl::StrContains(Problem(d), "exactly one trainer"))
      << Problem(d);
  // A rank's own problem carries its code: a cancelled call is a retry's.
  h[2].trainer_rank = 2;
  CopyProblem("the trainer's Step call was cancelled", h[1].problem);
  h[1].problem_code = static_cast<int32_t>(absl::StatusCode::kAborted);
  d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kAborted));
  EXPECT_TRUE(absl::StrContains(Problem(d), "worker \"w1\": the trainer's"))
      << Problem(d);
}

// A worker among the trainers' ranks with no trainer attached (its trainer
// is attaching again, or it is a worker that should not be there) is a
// state a retry outlasts: UNAVAILABLE, naming it.
TEST(DecideRoundTest, AWorkerWithNoTrainerYetIsTransient) {
  std::vector<StepHeader> h = {Header(0, 6, 5), Header(1, 6, 5),
                               Header(2, 6, 5)};
  h[1].trainer_rank = -1;
  const RoundDecision d = DecideRound(h, 3, kIds, 100);
  EXPECT_EQ(KindOf(d), RoundKind::kReject);
  EXPECT_EQ(d.code, static_cast<int32_t>(absl::StatusCode::kUnavailable));
  EXPECT_TRUE(absl::StrContains(Problem(d), "worker \"w1\" has no trainer"))
      << Problem(d);
}

TEST(StepRequestProblemTest, NamesTheField) {
  StepRequest r;
  EXPECT_EQ(StepRequestProblem(r, 0), "");
  r.lr = -1;  // the default
  EXPECT_EQ(StepRequestProblem(r, 0), "");
  r.lr = -INFINITY;
  EXPECT_TRUE(absl::StartsWith(StepRequestProblem(r, 0), "lr: "));
  r.lr = 0.1;
  r.adamw_lr = NAN;
  EXPECT_TRUE(absl::StartsWith(StepRequestProblem(r, 0), "adamw_lr: "));
  r.adamw_lr = -1;
  // No values: every group takes the step's.
  EXPECT_EQ(StepRequestProblem(r, 2), "");
  r.groups.push_back({0.1, 0, -1, -1});
  EXPECT_EQ(StepRequestProblem(r, 2),
            "groups: 1 entries; the trainer attached tensors in 2 groups");
  r.groups.push_back({0.2, -0.5, 1e-3, 0});  // negative: the step's own
  EXPECT_EQ(StepRequestProblem(r, 2), "");
  r.groups[1].adamw_weight_decay = INFINITY;
  EXPECT_TRUE(absl::StartsWith(StepRequestProblem(r, 2),
                               "groups[1].adamw_weight_decay: inf"));
}

// The digests a round compares: a group's value, or a tensor's group,
// changes them.
TEST(StepDigestTest, GroupValuesAndMembershipChangeTheDigests) {
  StepRequest r;
  r.groups.push_back({0.1, 0.01, -1, -1});
  const uint64_t one = HyperHash(r);
  r.groups[0].adamw_lr = 1e-3;
  EXPECT_NE(HyperHash(r), one);
  const std::vector<AdamWTensorSpec> tensors = {{"bias", 7, true, -1}};
  const uint64_t none = TensorsHash(tensors, {-1, -1});
  EXPECT_NE(TensorsHash(tensors, {0, -1}), none);
  EXPECT_NE(TensorsHash({{"bias", 7, true, 0}}, {-1, -1}), none);
}

}  // namespace
}  // namespace worker
}  // namespace muonps
