// Membership: workers joining (the plan versions joins bring; their cost
// tables in membership_cost_table_test.cc), retries and
// takeovers of a worker id, heartbeats and lease expiry, listing and
// leaving, and the worker token every worker call needs.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_fixture.h"
#include "server/coordinator/coordinator_wire.h"

namespace muonps {
namespace coordinator {
namespace {

using coordinator_test::Beat;
using coordinator_test::CoordinatorTest;
using coordinator_test::Create;
using coordinator_test::Join;
using coordinator_test::kGiB;
using coordinator_test::kTtl;
using coordinator_test::Leave;
using coordinator_test::PlanOf;
using coordinator_test::Spec;
using coordinator_test::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr int64_t kMiB = int64_t{1} << 20;

// Matrix name -> owner of each expert.
std::map<std::string, std::vector<std::string>> Owners(const v1::Plan& plan) {
  std::map<std::string, std::vector<std::string>> out;
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    out[m.name()].assign(m.owners().begin(), m.owners().end());
  }
  return out;
}

// Matrices (2-D ones: the first owner) owned by `worker`.
std::vector<std::string> OwnedBy(const v1::Plan& plan,
                                 const std::string& worker) {
  std::vector<std::string> out;
  for (const v1::MatrixPlacement& m : plan.matrices()) {
    if (!m.owners().empty() && m.owners(0) == worker) out.push_back(m.name());
  }
  return out;
}

TEST_F(CoordinatorTest, JoinBeyondMaxWorkersPerJobIsResourceExhausted) {
  CoordinatorOptions options = Options();
  options.limits.max_workers_per_job = 2;
  Reset(options);
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  EXPECT_THAT(state_->JoinJob(Join("x", "w3")).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit of 2"));
  EXPECT_EQ(CurrentPlan("x").version(), 2);
  EXPECT_EQ(JoinOk("x", "w2"), 2);  // a retry is not a new worker
}

TEST_F(CoordinatorTest, FirstWorkerGetsVersionOneOwningEveryMatrix) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 6))).ok());
  absl::StatusOr<v1::JoinJobResponse> join = state_->JoinJob(Join("x", "w1"));
  ASSERT_TRUE(join.ok()) << join.status();
  EXPECT_EQ(join->plan_version(), 1);
  EXPECT_EQ(join->lease_ttl_ms(), 10000);
  EXPECT_EQ(join->heartbeat_interval_ms(), 2000);
  const v1::Plan plan = CurrentPlan("x");
  EXPECT_EQ(plan.version(), 1);
  EXPECT_EQ(plan.name(), "jobs/x/plans/1");
  EXPECT_THAT(plan.workers(), ElementsAre("w1"));
  ASSERT_EQ(plan.matrices_size(), 6);
  for (const auto& [name, owners] : Owners(plan)) {
    EXPECT_THAT(owners, ElementsAre("w1")) << name;
  }
  EXPECT_THAT(state_->GetJob("x")->workers(), ElementsAre("w1"));
}

TEST_F(CoordinatorTest, DedicatedWorkersRankLastAndOwnMatricesToo) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 8))).ok());
  v1::JoinJobRequest pool = Join("x", "pool0");
  pool.set_dedicated(true);
  ASSERT_TRUE(state_->JoinJob(pool).ok());
  // Only a dedicated worker: no plan can step (nothing has a trainer).
  EXPECT_FALSE(state_->GetPlan(PlanOf("x", 1)).ok());
  EXPECT_EQ(JoinOk("x", "w1"), 1);
  const v1::Plan plan = CurrentPlan("x");
  // The worker with a trainer first, whatever the join order.
  EXPECT_THAT(plan.workers(), ElementsAre("w1", "pool0"));
  EXPECT_EQ(plan.dedicated_workers(), 1);
  EXPECT_FALSE(OwnedBy(plan, "pool0").empty());
  EXPECT_FALSE(OwnedBy(plan, "w1").empty());
}

TEST_F(CoordinatorTest, SecondWorkerGetsVersionTwoSharingTheMatrices) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 8))).ok());
  EXPECT_EQ(JoinOk("x", "w1"), 1);
  EXPECT_EQ(JoinOk("x", "w2"), 2);
  const v1::Plan plan = CurrentPlan("x");
  EXPECT_EQ(plan.version(), 2);
  EXPECT_THAT(plan.workers(), ElementsAre("w1", "w2"));
  EXPECT_FALSE(OwnedBy(plan, "w1").empty());
  EXPECT_FALSE(OwnedBy(plan, "w2").empty());
  EXPECT_EQ(OwnedBy(plan, "w1").size() + OwnedBy(plan, "w2").size(), 8u);
  EXPECT_GT(plan.moved_bytes(), 0);  // w2's share came from w1
  // Version 1 is still there, unchanged.
  absl::StatusOr<v1::Plan> v1 = state_->GetPlan(PlanOf("x", 1));
  ASSERT_TRUE(v1.ok()) << v1.status();
  EXPECT_THAT(v1->workers(), ElementsAre("w1"));
}

TEST_F(CoordinatorTest,
       JoinRetryWithSameInstanceKeepsVersionAndPublishesNothing) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  EXPECT_EQ(JoinOk("x", "w2"), 2);
  clock_.Advance(absl::Seconds(5));
  EXPECT_EQ(JoinOk("x", "w2"), 2);
  EXPECT_EQ(CurrentPlan("x").version(), 2);
  EXPECT_EQ(state_->Counts().plan_versions, 2);
  EXPECT_THAT(state_->GetJob("x")->workers(), ElementsAre("w1", "w2"));
  // The retry renewed the lease: 5 s after the first join it has 10 s left.
  clock_.Advance(absl::Seconds(6));
  EXPECT_THAT(state_->ExpireLeases(), ElementsAre("x/w1"));
}

TEST_F(CoordinatorTest, OtherInstanceTakesOverWorkerIdOnlyAfterLeaseExpires) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  EXPECT_EQ(JoinOk("x", "w2"), 2);
  clock_.Advance(absl::Seconds(9));
  EXPECT_THAT(state_->JoinJob(Join("x", "w2", 4 * kGiB, "restarted")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "worker_id"));
  EXPECT_EQ(CurrentPlan("x").version(), 2);
  ASSERT_TRUE(state_->Heartbeat(Beat("x", "w1", 2)).ok());
  clock_.Advance(absl::Seconds(2));  // w2's lease ran out 1 s ago
  absl::StatusOr<v1::JoinJobResponse> takeover =
      state_->JoinJob(Join("x", "w2", 4 * kGiB, "restarted"));
  ASSERT_TRUE(takeover.ok()) << takeover.status();
  EXPECT_EQ(takeover->plan_version(), 3);
  const v1::Plan plan = CurrentPlan("x");
  EXPECT_EQ(plan.version(), 3);
  EXPECT_THAT(plan.workers(), UnorderedElementsAre("w1", "w2"));
  EXPECT_THAT(state_->Heartbeat(Beat("x", "w2", 3)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "instance_id"));
  EXPECT_TRUE(state_->Heartbeat(Beat("x", "w2", 3, "restarted")).ok());
}

TEST_F(CoordinatorTest, JobTooBigForWorkersHasNoPlanUntilRoomyWorkerJoins) {
  // One 1024 x 1024 fp32 matrix takes 12 MiB to own; 8 MiB cannot hold it.
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 1))).ok());
  absl::StatusOr<v1::JoinJobResponse> small =
      state_->JoinJob(Join("x", "small", 8 * kMiB));
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(small->plan_version(), 0);
  const absl::Status no_plan = state_->GetPlan(PlanOf("x")).status();
  EXPECT_THAT(no_plan,
              StatusIs(absl::StatusCode::kFailedPrecondition, "\"x\""));
  EXPECT_THAT(std::string(no_plan.message()),
              HasSubstr("needs 12582912 bytes"));
  EXPECT_THAT(std::string(no_plan.message()), HasSubstr("\"small\""));
  EXPECT_EQ(state_->Counts().plan_versions, 0);

  EXPECT_EQ(JoinOk("x", "roomy", kGiB), 1);
  const v1::Plan plan = CurrentPlan("x");
  EXPECT_EQ(plan.version(), 1);
  EXPECT_THAT(plan.workers(), ElementsAre("small", "roomy"));
  EXPECT_THAT(OwnedBy(plan, "roomy"), ElementsAre("layers.0.w"));
}

TEST_F(CoordinatorTest, HeartbeatRenewsLeaseAndExpiryMovesMatricesToSurvivors) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 12))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  EXPECT_EQ(JoinOk("x", "w3"), 3);
  const v1::Plan before = CurrentPlan("x");
  const std::vector<std::string> lost = OwnedBy(before, "w3");
  ASSERT_FALSE(lost.empty());

  clock_.Advance(kTtl * 0.9);
  for (const char* w : {"w1", "w2", "w3"}) {
    ASSERT_TRUE(state_->Heartbeat(Beat("x", w, 3)).ok()) << w;
  }
  clock_.Advance(kTtl * 0.9);  // 18 s after joining: only renewal keeps them
  EXPECT_THAT(state_->ExpireLeases(), IsEmpty());
  EXPECT_EQ(CurrentPlan("x").version(), 3);
  ASSERT_TRUE(state_->Heartbeat(Beat("x", "w1", 3)).ok());
  ASSERT_TRUE(state_->Heartbeat(Beat("x", "w2", 3)).ok());
  clock_.Advance(kTtl * 0.2);  // w3's lease ran out 1 s ago
  EXPECT_THAT(state_->ExpireLeases(), ElementsAre("x/w3"));

  const v1::Plan after = CurrentPlan("x");
  EXPECT_EQ(after.version(), 4);
  EXPECT_THAT(after.workers(), ElementsAre("w1", "w2"));
  EXPECT_THAT(after.reason(), HasSubstr("w3"));
  const auto owners = Owners(after);
  for (const auto& [name, who] : owners) {
    EXPECT_THAT(who, testing::Each(testing::AnyOf("w1", "w2"))) << name;
  }
  EXPECT_EQ(owners.size(), 12u);
  // At least every matrix w3 held moved (4 MiB of fp32 momentum each).
  EXPECT_GE(after.moved_bytes(), static_cast<int64_t>(lost.size()) * 4 * kMiB);
  EXPECT_THAT(state_->GetJob("x")->workers(), ElementsAre("w1", "w2"));
  EXPECT_THAT(state_->Heartbeat(Beat("x", "w3", 3)).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"w3\""));
}

// A job of two trainers: a third worker with no trainer (started by
// mistake, a spare) is a standby that no plan ranks, so no step waits for
// it and its join publishes nothing; once its own trainer asks for it
// while a rank's has not come back, the lease monitor ranks it instead.
TEST_F(CoordinatorTest, AWorkerBeyondTheJobsTrainersIsAStandby) {
  v1::JobSpec spec = Spec("x", 6);
  spec.set_trainers(2);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  JoinOk("x", "w1");
  EXPECT_EQ(JoinOk("x", "w2"), 2);
  EXPECT_EQ(JoinOk("x", "stray"), 2);  // no new version
  EXPECT_THAT(CurrentPlan("x").workers(), ElementsAre("w1", "w2"));
  v1::ListWorkersRequest list_request;
  list_request.set_job("x");
  absl::StatusOr<v1::ListWorkersResponse> list =
      state_->ListWorkers(list_request);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->workers_size(), 3);
  EXPECT_FALSE(list->workers(1).standby());
  EXPECT_TRUE(list->workers(2).standby());
  // Heartbeats with trainers where the ranks are change nothing.
  for (const char* w : {"w1", "w2"}) {
    v1::HeartbeatRequest beat = Beat("x", w, 2);
    beat.set_has_trainer(true);
    ASSERT_TRUE(state_->Heartbeat(beat).ok()) << w;
  }
  ASSERT_TRUE(state_->Heartbeat(Beat("x", "stray", 2)).ok());
  EXPECT_THAT(state_->ExpireLeases(), IsEmpty());
  EXPECT_EQ(CurrentPlan("x").version(), 2);
  // The stray leaving publishes nothing either.
  v1::LeaveJobRequest leave = Leave("x", "stray");
  ASSERT_TRUE(state_->LeaveJob(leave).ok());
  EXPECT_EQ(CurrentPlan("x").version(), 2);
  // A rank lost for good (its lease ran out) is replaced by the standby.
  JoinOk("x", "spare");
  EXPECT_EQ(CurrentPlan("x").version(), 2);
  clock_.Advance(kTtl * 0.9);
  for (const char* w : {"w1", "spare"}) {
    ASSERT_TRUE(state_->Heartbeat(Beat("x", w, 2)).ok()) << w;
  }
  clock_.Advance(kTtl * 0.2);
  EXPECT_THAT(state_->ExpireLeases(), ElementsAre("x/w2"));
  EXPECT_EQ(CurrentPlan("x").version(), 3);
  EXPECT_THAT(CurrentPlan("x").workers(), ElementsAre("w1", "spare"));
  // w2 comes back while "spare", ranked, has no trainer: w2 joins as a
  // standby, and once its trainer asks for it (the heartbeat says so),
  // the lease monitor ranks it in place of "spare".
  EXPECT_EQ(JoinOk("x", "w2"), 3);
  EXPECT_THAT(CurrentPlan("x").workers(), ElementsAre("w1", "spare"));
  v1::HeartbeatRequest asked = Beat("x", "w2", 3);
  asked.set_has_trainer(true);
  ASSERT_TRUE(state_->Heartbeat(asked).ok());
  EXPECT_EQ(CurrentPlan("x").version(), 3);  // not planned by a heartbeat
  EXPECT_THAT(state_->ExpireLeases(), IsEmpty());
  const v1::Plan swapped = CurrentPlan("x");
  EXPECT_EQ(swapped.version(), 4);
  EXPECT_THAT(swapped.workers(), ElementsAre("w1", "w2"));
  EXPECT_THAT(swapped.reason(), HasSubstr("w2 has a trainer"));
}

TEST_F(CoordinatorTest, HeartbeatRejectsOtherInstanceAndFutureVersion) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  absl::StatusOr<v1::HeartbeatResponse> ok =
      state_->Heartbeat(Beat("x", "w1", 1));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->plan_version(), 1);
  EXPECT_EQ(ok->lease_ttl_ms(), 10000);
  EXPECT_THAT(state_->Heartbeat(Beat("x", "w1", 1, "impostor")).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "instance_id"));
  // A version above the latest is a plan this coordinator never published
  // (a restart without state): the worker must join again, so not
  // INVALID_ARGUMENT, which workers do not take for a lost lease.
  EXPECT_THAT(state_->Heartbeat(Beat("x", "w1", 2)).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "plan_version: 2 is newer"));
  EXPECT_THAT(state_->Heartbeat(Beat("x", "w1", -1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "plan_version"));
  EXPECT_THAT(state_->Heartbeat(Beat("x", "nobody", 1)).status(),
              StatusIs(absl::StatusCode::kNotFound, "worker_id"));
  EXPECT_THAT(state_->Heartbeat(Beat("y", "w1", 1)).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"y\""));
}

TEST_F(CoordinatorTest, ListWorkersReportsLeaseLeftOnTheClock) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(state_->Heartbeat(Beat("x", "w1", 1)).ok());
  clock_.Advance(absl::Milliseconds(2500));
  v1::ListWorkersRequest request;
  request.set_job("x");
  absl::StatusOr<v1::ListWorkersResponse> list = state_->ListWorkers(request);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->workers_size(), 1);
  EXPECT_EQ(list->workers(0).worker_id(), "w1");
  EXPECT_EQ(list->workers(0).lease_remaining_ms(), 7500);
  EXPECT_EQ(list->workers(0).plan_version(), 1);
  EXPECT_EQ(list->workers(0).data_address(), "w1.local:7001");
}

TEST_F(CoordinatorTest, LeaveJobPublishesNewVersionAndLeavingTwiceIsNotFound) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  v1::LeaveJobRequest impostor = Leave("x", "w2");
  impostor.set_instance_id("impostor");
  EXPECT_THAT(state_->LeaveJob(impostor).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "instance_id"));
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w2")).ok());
  const v1::Plan plan = CurrentPlan("x");
  EXPECT_EQ(plan.version(), 3);
  EXPECT_THAT(plan.workers(), ElementsAre("w1"));
  EXPECT_EQ(OwnedBy(plan, "w1").size(), 4u);
  EXPECT_THAT(state_->LeaveJob(Leave("x", "w2")).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"w2\""));
  EXPECT_EQ(CurrentPlan("x").version(), 3);
}

// A drain keeps the worker a rank of the next plan version but gives it
// nothing, so its momentum can move at the next step; its heartbeats and
// ListWorkers say it drains; a repeat answers the same version; the last
// worker that could own matrices cannot drain; leaving without drain then
// drops it.
TEST_F(CoordinatorTest, ADrainingWorkerStaysARankThatOwnsNothingUntilItLeaves) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  ASSERT_FALSE(OwnedBy(CurrentPlan("x"), "w2").empty());
  v1::LeaveJobRequest drain = Leave("x", "w2");
  drain.set_drain(true);
  absl::StatusOr<v1::LeaveJobResponse> drained = state_->LeaveJob(drain);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->plan_version(), 3);
  v1::Plan plan = CurrentPlan("x");
  EXPECT_EQ(plan.version(), 3);
  EXPECT_THAT(plan.workers(), ElementsAre("w1", "w2"));
  EXPECT_TRUE(OwnedBy(plan, "w2").empty());
  EXPECT_EQ(OwnedBy(plan, "w1").size(), 4u);
  EXPECT_THAT(plan.reason(), HasSubstr("worker w2 draining"));
  absl::StatusOr<v1::HeartbeatResponse> beat =
      state_->Heartbeat(Beat("x", "w2", 3));
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_TRUE(beat->draining());
  EXPECT_FALSE(state_->Heartbeat(Beat("x", "w1", 3))->draining());
  v1::ListWorkersRequest list_request;
  list_request.set_job("x");
  absl::StatusOr<v1::ListWorkersResponse> list =
      state_->ListWorkers(list_request);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->workers_size(), 2);
  EXPECT_FALSE(list->workers(0).draining());
  EXPECT_TRUE(list->workers(1).draining());

  drained = state_->LeaveJob(drain);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->plan_version(), 3);
  EXPECT_EQ(CurrentPlan("x").version(), 3);

  v1::LeaveJobRequest last = Leave("x", "w1");
  last.set_drain(true);
  EXPECT_THAT(state_->LeaveJob(last).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "drain"));
  EXPECT_EQ(CurrentPlan("x").version(), 3);

  absl::StatusOr<v1::LeaveJobResponse> left =
      state_->LeaveJob(Leave("x", "w2"));
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->plan_version(), 4);
  plan = CurrentPlan("x");
  EXPECT_EQ(plan.version(), 4);
  EXPECT_THAT(plan.workers(), ElementsAre("w1"));
}

// An operator's drain (DrainWorker, `muonps drain`) marks the worker as
// LeaveJob with drain does, and the worker learns it from its next
// heartbeat.
TEST_F(CoordinatorTest, AnOperatorDrainReachesTheWorkerByItsHeartbeat) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  v1::DrainWorkerRequest drain;
  drain.set_job("x");
  drain.set_worker_id("w9");
  EXPECT_THAT(state_->DrainWorker(drain).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"w9\""));
  EXPECT_EQ(CurrentPlan("x").version(), 2);
  EXPECT_FALSE(state_->Heartbeat(Beat("x", "w1", 2))->draining());
  drain.set_worker_id("w1");
  absl::StatusOr<v1::DrainWorkerResponse> drained = state_->DrainWorker(drain);
  ASSERT_TRUE(drained.ok()) << drained.status();
  EXPECT_EQ(drained->plan_version(), 3);
  EXPECT_TRUE(OwnedBy(CurrentPlan("x"), "w1").empty());
  EXPECT_TRUE(state_->Heartbeat(Beat("x", "w1", 3))->draining());
  // The worker's own drain, when it hears of it, answers the same version.
  v1::LeaveJobRequest leave = Leave("x", "w1");
  leave.set_drain(true);
  absl::StatusOr<v1::LeaveJobResponse> own = state_->LeaveJob(leave);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->plan_version(), 3);
}

// Under mutual TLS a worker's id is bound to the client certificate it
// joined with: a call with another certificate (or none) cannot heartbeat,
// leave or join as that id while it is a member, and changes nothing.
TEST_F(CoordinatorTest, AWorkersIdIsBoundToTheCertificateItJoinedWith) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  Membership& members = state_->core().membership();
  JoinRequest join = JoinRequestFromProto(Join("x", "w1"));
  join.certificate = "CN=w1 sha256:aa";
  const absl::StatusOr<JoinGrant> grant = members.JoinJob(join);
  ASSERT_TRUE(grant.ok()) << grant.status();
  HeartbeatRequest beat{
      "x", "w1", join.instance_id, 1, grant->worker_token, join.certificate};
  EXPECT_TRUE(members.Heartbeat(beat).ok());
  for (const std::string other : {"CN=w1 sha256:bb", ""}) {
    beat.certificate = other;
    EXPECT_THAT(members.Heartbeat(beat).status(),
                StatusIs(absl::StatusCode::kPermissionDenied, "sha256:aa"));
    JoinRequest intruder = join;
    intruder.instance_id = "intruder";
    intruder.certificate = other;
    EXPECT_THAT(members.JoinJob(intruder).status(),
                StatusIs(absl::StatusCode::kPermissionDenied, "worker_id"));
    LeaveRequest leave{"x",   "w1", join.instance_id, grant->worker_token,
                       false, other};
    EXPECT_THAT(members.LeaveJob(leave).status(),
                StatusIs(absl::StatusCode::kPermissionDenied, "worker_id"));
  }
  EXPECT_EQ(CurrentPlan("x").version(), 1);
  // The same certificate: a retried join keeps the lease and its token.
  const absl::StatusOr<JoinGrant> again = members.JoinJob(join);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->worker_token, grant->worker_token);
  LeaveRequest leave{"x",
                     "w1",
                     join.instance_id,
                     grant->worker_token,
                     false,
                     join.certificate};
  EXPECT_TRUE(members.LeaveJob(leave).ok());
}

TEST_F(CoordinatorTest, LastWorkerLeavingLeavesNoCurrentPlanButKeepsHistory) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w2")).ok());
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w1")).ok());
  EXPECT_THAT(state_->GetPlan(PlanOf("x")).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "no workers"));
  for (int64_t version : {1, 2, 3}) {
    absl::StatusOr<v1::Plan> plan = state_->GetPlan(PlanOf("x", version));
    ASSERT_TRUE(plan.ok()) << version << ": " << plan.status();
    EXPECT_EQ(plan->version(), version);
  }
  EXPECT_THAT(state_->GetJob("x")->workers(), IsEmpty());
  // A worker coming back gets a plan again, numbered after the old ones.
  EXPECT_EQ(JoinOk("x", "w1"), 4);
  EXPECT_EQ(CurrentPlan("x").version(), 4);
}

TEST_F(CoordinatorTest, WorkerCallsNeedTheTokenJoinJobGaveThatWorker) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  ASSERT_TRUE(state_->CreateJob(Create(Spec("y", 2))).ok());
  JoinOk("x", "w1");
  JoinOk("y", "w1");
  const std::string mine = state_->worker_token("x", "w1");
  const std::string other_job = state_->worker_token("y", "w1");
  ASSERT_EQ(mine.size(), 64u);
  ASSERT_NE(mine, other_job);

  v1::HeartbeatRequest beat = Beat("x", "w1", 1);
  beat.set_worker_token("0123456789abcdef0123456789abcdef");
  EXPECT_THAT(state_->Heartbeat(beat).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  beat.set_worker_token(other_job);  // a token of another job
  EXPECT_THAT(state_->Heartbeat(beat).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "wrong"));
  beat.set_worker_token(mine);
  EXPECT_TRUE(state_->Heartbeat(beat).ok());

  v1::LeaveJobRequest leave = Leave("x", "w1");
  leave.set_worker_token(other_job);
  EXPECT_THAT(state_->LeaveJob(leave).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  v1::ReportStepStatsRequest stats;
  stats.set_job("x");
  stats.set_worker_id("w1");
  stats.set_worker_token(other_job);
  EXPECT_THAT(state_->ReportStepStats(stats),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  // Nothing changed: w1 still holds its lease in x.
  EXPECT_EQ(CurrentPlan("x").workers_size(), 1);
}

TEST_F(CoordinatorTest, JoinRetryKeepsTheTokenTakeoverGetsANewOne) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  absl::StatusOr<v1::JoinJobResponse> first = state_->JoinJob(Join("x", "w1"));
  ASSERT_TRUE(first.ok());
  absl::StatusOr<v1::JoinJobResponse> retry = state_->JoinJob(Join("x", "w1"));
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->worker_token(), first->worker_token());
  EXPECT_EQ(retry->data_plane_secret(), first->data_plane_secret());
  EXPECT_EQ(first->data_plane_secret().size(), 64u);

  clock_.Advance(kTtl + absl::Seconds(1));
  absl::StatusOr<v1::JoinJobResponse> takeover =
      state_->JoinJob(Join("x", "w1", 4 * kGiB, "another-instance"));
  ASSERT_TRUE(takeover.ok()) << takeover.status();
  EXPECT_NE(takeover->worker_token(), first->worker_token());
  v1::HeartbeatRequest old = Beat("x", "w1", 1);
  old.set_worker_token(first->worker_token());
  EXPECT_THAT(state_->Heartbeat(old).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
