#include "server/coordinator/coordinator_state.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/fake_clock.h"

namespace muonps {
namespace coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr absl::Duration kTtl = absl::Seconds(10);

// The status has `code` and a message containing `part`.
MATCHER_P2(StatusIs, code, part, "") {
  *result_listener << "status is " << arg;
  return arg.code() == code &&
         std::string(arg.message()).find(part) != std::string::npos;
}

// A CoordinatorState whose callers hold the credentials it hands out, as
// real workers and trainers do: it keeps the job token of every CreateJob
// and the worker token of every JoinJob, and fills them into requests that
// leave them empty (tests of the credentials themselves set them).
class CredentialedState {
 public:
  template <typename... Args>
  explicit CredentialedState(Args&&... args)
      : state_(std::forward<Args>(args)...) {}

  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& r) {
    absl::StatusOr<v1::Job> job = state_.CreateJob(r);
    if (job.ok()) job_tokens_[r.job().name()] = job->job_token();
    return job;
  }
  absl::StatusOr<v1::Job> GetJob(const std::string& job) {
    return state_.GetJob(job);
  }
  v1::ListJobsResponse ListJobs() { return state_.ListJobs(); }
  absl::Status DeleteJob(const std::string& job) {
    v1::DeleteJobRequest r;
    r.set_job(job);
    r.set_job_token(job_tokens_[job]);
    return state_.DeleteJob(r);
  }
  absl::Status DeleteJob(const v1::DeleteJobRequest& r) {
    return state_.DeleteJob(r);
  }
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& r) {
    absl::StatusOr<v1::JoinJobResponse> out = state_.JoinJob(r);
    if (out.ok())
      worker_tokens_[{r.job(), r.worker_id()}] = out->worker_token();
    return out;
  }
  template <typename Request>
  Request WithToken(Request r) {
    if (r.worker_token().empty()) {
      r.set_worker_token(worker_tokens_[{r.job(), r.worker_id()}]);
    }
    return r;
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(v1::HeartbeatRequest r) {
    return state_.Heartbeat(WithToken(std::move(r)));
  }
  absl::Status LeaveJob(v1::LeaveJobRequest r) {
    return state_.LeaveJob(WithToken(std::move(r)));
  }
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
      const v1::ListWorkersRequest& r) {
    return state_.ListWorkers(r);
  }
  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& r) {
    return state_.GetPlan(r);
  }
  absl::StatusOr<std::optional<v1::Plan>> WaitForPlan(const std::string& job,
                                                      int64_t known_version,
                                                      absl::Duration timeout) {
    return state_.WaitForPlan(job, known_version, timeout);
  }
  absl::Status PutNcclId(v1::PutNcclIdRequest r) {
    return state_.PutNcclId(WithToken(std::move(r)));
  }
  absl::StatusOr<v1::GetNcclIdResponse> GetNcclId(v1::GetNcclIdRequest r) {
    return state_.GetNcclId(WithToken(std::move(r)));
  }
  absl::Status ReportStepStats(v1::ReportStepStatsRequest r) {
    return state_.ReportStepStats(WithToken(std::move(r)));
  }
  std::vector<std::string> ExpireLeases() { return state_.ExpireLeases(); }
  StateCounts Counts() { return state_.Counts(); }
  const std::string& job_token(const std::string& job) {
    return job_tokens_[job];
  }
  const std::string& worker_token(const std::string& job,
                                  const std::string& worker) {
    return worker_tokens_[{job, worker}];
  }

 private:
  CoordinatorState state_;
  std::map<std::string, std::string> job_tokens_;
  std::map<std::pair<std::string, std::string>, std::string> worker_tokens_;
};

// `count` fp32 matrices of rows x cols (4 MiB of momentum each by default),
// one per layer.
v1::JobSpec Spec(const std::string& name, int count, int64_t rows = 1024,
                 int64_t cols = 1024) {
  v1::JobSpec spec;
  spec.set_name(name);
  for (int i = 0; i < count; ++i) {
    v1::Matrix* m = spec.add_matrices();
    m->set_name(absl::StrCat("layers.", i, ".w"));
    m->set_rows(rows);
    m->set_cols(cols);
    m->set_layer(i);
  }
  return spec;
}

v1::CreateJobRequest Create(const v1::JobSpec& spec,
                            const std::string& request_id = "") {
  v1::CreateJobRequest r;
  r.set_request_id(request_id);
  *r.mutable_job() = spec;
  return r;
}

v1::JoinJobRequest Join(const std::string& job, const std::string& worker,
                        int64_t memory_bytes = 4 * kGiB,
                        const std::string& instance = "") {
  v1::JoinJobRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id(instance.empty() ? "i-" + worker : instance);
  r.mutable_device()->set_kind("cuda");
  r.mutable_device()->set_memory_bytes(memory_bytes);
  r.set_data_address(absl::StrCat(worker, ".local:7001"));
  return r;
}

v1::HeartbeatRequest Beat(const std::string& job, const std::string& worker,
                          int64_t plan_version,
                          const std::string& instance = "") {
  v1::HeartbeatRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id(instance.empty() ? "i-" + worker : instance);
  r.set_plan_version(plan_version);
  return r;
}

v1::LeaveJobRequest Leave(const std::string& job, const std::string& worker) {
  v1::LeaveJobRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id("i-" + worker);
  return r;
}

v1::GetPlanRequest PlanOf(const std::string& job, int64_t version = 0) {
  v1::GetPlanRequest r;
  r.set_job(job);
  r.set_version(version);
  return r;
}

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

class CoordinatorStateTest : public ::testing::Test {
 protected:
  CoordinatorStateTest() { Reset(Options()); }

  static CoordinatorOptions Options() {
    CoordinatorOptions options;
    options.lease_ttl = kTtl;
    options.heartbeat_interval = absl::Seconds(2);
    return options;
  }
  void Reset(const CoordinatorOptions& options) {
    state_ = std::make_unique<CredentialedState>(
        options, [this] { return clock_.Now(); });
  }
  // Joins `worker` and returns the plan version the response names.
  int64_t JoinOk(const std::string& job, const std::string& worker,
                 int64_t memory_bytes = 4 * kGiB) {
    absl::StatusOr<v1::JoinJobResponse> r =
        state_->JoinJob(Join(job, worker, memory_bytes));
    EXPECT_TRUE(r.ok()) << worker << ": " << r.status();
    return r.ok() ? r->plan_version() : -1;
  }
  v1::Plan CurrentPlan(const std::string& job) {
    absl::StatusOr<v1::Plan> plan = state_->GetPlan(PlanOf(job));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return plan.ok() ? *plan : v1::Plan();
  }

  FakeClock clock_;
  std::unique_ptr<CredentialedState> state_;
};

TEST_F(CoordinatorStateTest, CreateJobReturnsJobsSlashNameAtPlanVersionZero) {
  absl::StatusOr<v1::Job> job = state_->CreateJob(Create(Spec("x", 2), "r1"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name(), "jobs/x");
  EXPECT_EQ(job->plan_version(), 0);
  EXPECT_THAT(job->workers(), IsEmpty());
  EXPECT_EQ(job->spec().matrices_size(), 2);
  EXPECT_EQ(job->create_time_ms(), int64_t{1700000000} * 1000);
  absl::StatusOr<v1::Job> got = state_->GetJob("x");
  ASSERT_TRUE(got.ok()) << got.status();
  v1::Job without_token = *job;
  without_token.clear_job_token();  // CreateJob's answer alone holds it
  EXPECT_EQ(got->DebugString(), without_token.DebugString());
}

TEST_F(CoordinatorStateTest,
       GetPlanBeforeAnyWorkerIsFailedPreconditionNoWorker) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  const absl::Status status = state_->GetPlan(PlanOf("x")).status();
  EXPECT_THAT(status, StatusIs(absl::StatusCode::kFailedPrecondition, "\"x\""));
  EXPECT_THAT(std::string(status.message()), HasSubstr("no worker"));
}

TEST_F(CoordinatorStateTest, CreateJobRetryWithSameRequestIdReturnsSameJob) {
  absl::StatusOr<v1::Job> first = state_->CreateJob(Create(Spec("x", 2), "r1"));
  ASSERT_TRUE(first.ok()) << first.status();
  clock_.Advance(absl::Seconds(3));
  absl::StatusOr<v1::Job> retry = state_->CreateJob(Create(Spec("x", 2), "r1"));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->DebugString(), first->DebugString());
  EXPECT_EQ(state_->Counts().jobs, 1);
}

TEST_F(CoordinatorStateTest,
       CreateJobOfExistingNameWithOtherRequestIsAlreadyExists) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2), "r1")).ok());
  EXPECT_THAT(state_->CreateJob(Create(Spec("x", 2), "r2")).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "job.name"));
  // Without a request_id a second create is not a retry.
  ASSERT_TRUE(state_->CreateJob(Create(Spec("y", 1))).ok());
  EXPECT_THAT(state_->CreateJob(Create(Spec("y", 1))).status(),
              StatusIs(absl::StatusCode::kAlreadyExists, "\"y\""));
}

TEST_F(CoordinatorStateTest, CreateJobBeyondMaxJobsIsResourceExhausted) {
  CoordinatorOptions options = Options();
  options.limits.max_jobs = 2;
  Reset(options);
  ASSERT_TRUE(state_->CreateJob(Create(Spec("a", 1), "ra")).ok());
  ASSERT_TRUE(state_->CreateJob(Create(Spec("b", 1))).ok());
  EXPECT_THAT(state_->CreateJob(Create(Spec("c", 1))).status(),
              StatusIs(absl::StatusCode::kResourceExhausted, "limit of 2"));
  EXPECT_TRUE(state_->CreateJob(Create(Spec("a", 1), "ra")).ok());  // retry
  ASSERT_TRUE(state_->DeleteJob("b").ok());
  EXPECT_TRUE(state_->CreateJob(Create(Spec("c", 1))).ok());
}

TEST_F(CoordinatorStateTest,
       CreateJobWithBadSpecOrLongRequestIdCreatesNothing) {
  v1::JobSpec bad = Spec("x", 3);
  bad.mutable_matrices(2)->set_rows(0);
  EXPECT_THAT(
      state_->CreateJob(Create(bad)).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "job.matrices[2].rows"));
  EXPECT_THAT(
      state_->CreateJob(Create(Spec("x", 1), std::string(65, 'r'))).status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "request_id"));
  EXPECT_EQ(state_->Counts().jobs, 0);
  EXPECT_THAT(state_->GetJob("x").status(),
              StatusIs(absl::StatusCode::kNotFound, "\"x\""));
}

TEST_F(CoordinatorStateTest, ListJobsCountsExpertsAsMatricesAndSumsParameters) {
  v1::JobSpec spec = Spec("moe", 1, 64, 32);
  v1::Matrix* experts = spec.add_matrices();
  experts->set_name("layers.1.experts");
  experts->set_rows(16);
  experts->set_cols(8);
  experts->set_experts(4);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  ASSERT_TRUE(state_->CreateJob(Create(Spec("dense", 3, 10, 10))).ok());
  JoinOk("moe", "w1");
  const v1::ListJobsResponse list = state_->ListJobs();
  ASSERT_EQ(list.jobs_size(), 2);
  const v1::JobSummary& dense = list.jobs(0);  // jobs are sorted by name
  EXPECT_EQ(dense.name(), "dense");
  EXPECT_EQ(dense.matrices(), 3);
  EXPECT_EQ(dense.parameters(), 300);
  EXPECT_EQ(dense.workers(), 0);
  const v1::JobSummary& moe = list.jobs(1);
  EXPECT_EQ(moe.name(), "moe");
  EXPECT_EQ(moe.matrices(), 1 + 4);
  EXPECT_EQ(moe.parameters(), 64 * 32 + 4 * 16 * 8);
  EXPECT_EQ(moe.workers(), 1);
  EXPECT_EQ(moe.plan_version(), 1);
}

TEST_F(CoordinatorStateTest,
       JobTooLargeToCountIsRejectedOrListedWithoutOverflow) {
  // 128 stacks of 65536 experts of 2^20 x 2^20 pass every per-matrix limit
  // but hold 128 * 2^56 = 2^63 parameters, one more than int64 holds.
  v1::JobSpec spec = Spec("huge", 128, int64_t{1} << 20, int64_t{1} << 20);
  for (v1::Matrix& m : *spec.mutable_matrices()) m.set_experts(65536);
  absl::StatusOr<v1::Job> job = state_->CreateJob(Create(spec));
  if (!job.ok()) {
    EXPECT_TRUE(job.status().code() == absl::StatusCode::kInvalidArgument ||
                job.status().code() == absl::StatusCode::kResourceExhausted)
        << job.status();
    return;
  }
  const v1::ListJobsResponse list = state_->ListJobs();
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).matrices(), 128 * 65536);
  EXPECT_GT(list.jobs(0).parameters(), 0)
      << "the parameter count overflowed int64";
}

TEST_F(CoordinatorStateTest, JoinBeyondMaxWorkersPerJobIsResourceExhausted) {
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

TEST_F(CoordinatorStateTest, FirstWorkerGetsVersionOneOwningEveryMatrix) {
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

TEST_F(CoordinatorStateTest, DedicatedWorkersRankLastAndOwnMatricesToo) {
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

TEST_F(CoordinatorStateTest, SecondWorkerGetsVersionTwoSharingTheMatrices) {
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

TEST_F(CoordinatorStateTest,
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

TEST_F(CoordinatorStateTest,
       OtherInstanceTakesOverWorkerIdOnlyAfterLeaseExpires) {
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

TEST_F(CoordinatorStateTest, JoinParsesCostTableIntoPlanPredictions) {
  v1::JobSpec spec = Spec("x", 1, 64, 64);
  spec.mutable_muon()->set_ns_algorithm(v1::NS_ALGORITHM_NS5);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  join.set_cost_table(
      "# measured\n"
      "{\"device\": \"NVIDIA H200\"}\n"
      "{\"rows\": 64, \"cols\": 64, \"algorithm\": \"ns5\", \"batch\": 1, "
      "\"seconds\": 7.5}\n");
  join.set_speed(2.0);
  ASSERT_TRUE(state_->JoinJob(join).ok());
  const v1::Plan plan = CurrentPlan("x");
  ASSERT_EQ(plan.batches_size(), 1);
  // 7.5 s measured, at twice the table's speed.
  EXPECT_NEAR(plan.batches(0).predicted_seconds(), 3.75, 1e-9);
  EXPECT_EQ(plan.batches(0).algorithm(), v1::NS_ALGORITHM_NS5);
  // One matrix: one part, the whole batch.
  ASSERT_EQ(plan.batches(0).parts_size(), 1);
  EXPECT_EQ(plan.batches(0).parts(0).count(), 1);
  EXPECT_NEAR(plan.batches(0).parts(0).predicted_seconds(), 3.75, 1e-9);
}

// A table where four matrices take longer in one call than in two calls of
// two: the published batch carries the split, each part with its time.
TEST_F(CoordinatorStateTest, CostTableThatFavoursASplitPublishesTheParts) {
  v1::JobSpec spec = Spec("x", 4, 64, 64);
  spec.mutable_muon()->set_ns_algorithm(v1::NS_ALGORITHM_NS5);
  ASSERT_TRUE(state_->CreateJob(Create(spec)).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  std::string table;
  for (const auto& [batch, seconds] :
       std::vector<std::pair<int, double>>{{1, 1.0}, {2, 1.9}, {4, 4.0}}) {
    absl::StrAppend(&table, "{\"rows\": 64, \"cols\": 64, \"algorithm\": ",
                    "\"ns5\", \"batch\": ", batch, ", \"seconds\": ", seconds,
                    "}\n");
  }
  join.set_cost_table(table);
  ASSERT_TRUE(state_->JoinJob(join).ok());
  const v1::Plan plan = CurrentPlan("x");
  ASSERT_EQ(plan.batches_size(), 1);
  const v1::Batch& batch = plan.batches(0);
  EXPECT_EQ(batch.matrices_size(), 4);
  EXPECT_NEAR(batch.predicted_seconds(), 3.8, 1e-9);
  EXPECT_EQ(batch.algorithm(), v1::NS_ALGORITHM_NS5);
  ASSERT_EQ(batch.parts_size(), 2);
  for (const v1::BatchPart& part : batch.parts()) {
    EXPECT_EQ(part.count(), 2);
    EXPECT_EQ(part.algorithm(), v1::NS_ALGORITHM_NS5);
    EXPECT_NEAR(part.predicted_seconds(), 1.9, 1e-9);
  }
}

TEST_F(CoordinatorStateTest, MalformedCostTableIsInvalidArgumentNamingLine) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 1))).ok());
  v1::JoinJobRequest join = Join("x", "w1");
  join.set_cost_table("# header\nnot json\n");
  const absl::Status status = state_->JoinJob(join).status();
  EXPECT_THAT(status,
              StatusIs(absl::StatusCode::kInvalidArgument, "cost_table"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("line 2"));
  EXPECT_THAT(state_->GetJob("x")->workers(), IsEmpty());
  EXPECT_EQ(state_->Counts().workers, 0);
}

TEST_F(CoordinatorStateTest,
       JobTooBigForWorkersHasNoPlanUntilRoomyWorkerJoins) {
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

TEST_F(CoordinatorStateTest,
       HeartbeatRenewsLeaseAndExpiryMovesMatricesToSurvivors) {
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

TEST_F(CoordinatorStateTest, HeartbeatRejectsOtherInstanceAndFutureVersion) {
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

TEST_F(CoordinatorStateTest, ListWorkersReportsLeaseLeftOnTheClock) {
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

TEST_F(CoordinatorStateTest,
       LeaveJobPublishesNewVersionAndLeavingTwiceIsNotFound) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  v1::LeaveJobRequest impostor = Leave("x", "w2");
  impostor.set_instance_id("impostor");
  EXPECT_THAT(state_->LeaveJob(impostor),
              StatusIs(absl::StatusCode::kFailedPrecondition, "instance_id"));
  ASSERT_TRUE(state_->LeaveJob(Leave("x", "w2")).ok());
  const v1::Plan plan = CurrentPlan("x");
  EXPECT_EQ(plan.version(), 3);
  EXPECT_THAT(plan.workers(), ElementsAre("w1"));
  EXPECT_EQ(OwnedBy(plan, "w1").size(), 4u);
  EXPECT_THAT(state_->LeaveJob(Leave("x", "w2")),
              StatusIs(absl::StatusCode::kNotFound, "\"w2\""));
  EXPECT_EQ(CurrentPlan("x").version(), 3);
}

TEST_F(CoordinatorStateTest,
       LastWorkerLeavingLeavesNoCurrentPlanButKeepsHistory) {
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

TEST_F(CoordinatorStateTest, GetPlanReportsPrunedAndFutureVersionsAsNotFound) {
  CoordinatorOptions options = Options();
  options.plan_history = 3;
  Reset(options);
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 8))).ok());
  for (int i = 1; i <= 5; ++i) EXPECT_EQ(JoinOk("x", absl::StrCat("w", i)), i);
  EXPECT_THAT(state_->GetPlan(PlanOf("x", 1)).status(),
              StatusIs(absl::StatusCode::kNotFound, "pruned"));
  EXPECT_THAT(state_->GetPlan(PlanOf("x", 2)).status(),
              StatusIs(absl::StatusCode::kNotFound, "oldest kept is 3"));
  for (int64_t version : {3, 4, 5}) {
    EXPECT_TRUE(state_->GetPlan(PlanOf("x", version)).ok()) << version;
  }
  EXPECT_THAT(state_->GetPlan(PlanOf("x", 99)).status(),
              StatusIs(absl::StatusCode::kNotFound, "does not exist yet"));
  EXPECT_THAT(state_->GetPlan(PlanOf("x", -1)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, "version"));
}

TEST_F(CoordinatorStateTest, WaitForPlanReturnsAtOnceWhenNewerVersionExists) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 0, absl::Seconds(30));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->has_value());
  EXPECT_EQ((*plan)->version(), 1);
}

TEST_F(CoordinatorStateTest, WaitForPlanTimesOutWithNulloptWhenNothingChanges) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 1, absl::Milliseconds(100));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->has_value());
  EXPECT_THAT(state_->WaitForPlan("nope", 0, absl::Seconds(1)).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"nope\""));
}

TEST_F(CoordinatorStateTest,
       WaitForPlanSendsTheCurrentPlanAtOnceToAWatcherAheadOfTheJob) {
  // A worker that followed version 7 of a job this coordinator no longer
  // knows (it restarted without its state, and the job was created again)
  // must get the current plan, not wait for a version above 7.
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  JoinOk("x", "w2");
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 7, absl::Milliseconds(200));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->has_value()) << "timed out instead of sending version 2";
  EXPECT_EQ((*plan)->version(), 2);
  // A watcher on the current version still waits.
  plan = state_->WaitForPlan("x", 2, absl::Milliseconds(10));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->has_value());
}

TEST_F(CoordinatorStateTest, WaitForPlanWakesWhenAnotherThreadJoinsAWorker) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
  JoinOk("x", "w1");
  std::thread joiner([this] {
    absl::SleepFor(absl::Milliseconds(50));
    JoinOk("x", "w2");
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 1, absl::Seconds(2));
  const absl::Duration waited = absl::Now() - start;
  joiner.join();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->has_value()) << "timed out after " << waited;
  EXPECT_EQ((*plan)->version(), 2);
  EXPECT_THAT((*plan)->workers(), ElementsAre("w1", "w2"));
  EXPECT_LT(waited, absl::Seconds(2));
}

TEST_F(CoordinatorStateTest,
       WaitForPlanIsNotFoundWhenJobIsDeletedWhileWaiting) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  std::thread deleter([this] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(state_->DeleteJob("x").ok());
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<std::optional<v1::Plan>> plan =
      state_->WaitForPlan("x", 1, absl::Seconds(2));
  const absl::Duration waited = absl::Now() - start;
  deleter.join();
  EXPECT_THAT(plan.status(), StatusIs(absl::StatusCode::kNotFound, "\"x\""));
  EXPECT_LT(waited, absl::Seconds(2));
}

class NcclIdTest : public CoordinatorStateTest {
 protected:
  NcclIdTest() {
    EXPECT_TRUE(state_->CreateJob(Create(Spec("x", 4))).ok());
    JoinOk("x", "w1");
    JoinOk("x", "w2");
    const v1::Plan plan = CurrentPlan("x");
    rank0_ = plan.workers_size() > 0 ? plan.workers(0) : "";
    other_ = rank0_ == "w1" ? "w2" : "w1";
  }
  static std::string Id(char seed) {
    std::string id(128, '\0');  // binary, NULs included
    for (size_t i = 0; i < id.size(); i += 3)
      id[i] = static_cast<char>(seed + i);
    return id;
  }
  absl::Status Put(int64_t version, const std::string& worker,
                   const std::string& id, int64_t generation = 0) {
    v1::PutNcclIdRequest r;
    r.set_job("x");
    r.set_plan_version(version);
    r.set_worker_id(worker);
    r.set_nccl_id(id);
    r.set_generation(generation);
    return state_->PutNcclId(r);
  }
  absl::StatusOr<v1::GetNcclIdResponse> Get(int64_t version,
                                            int64_t min_generation = 0) {
    v1::GetNcclIdRequest r;
    r.set_job("x");
    r.set_worker_id(other_);
    r.set_plan_version(version);
    r.set_min_generation(min_generation);
    return state_->GetNcclId(r);
  }

  std::string rank0_;
  std::string other_;
};

TEST_F(NcclIdTest, RankZeroPutsOnceForCurrentVersionAndOthersGetIt) {
  ASSERT_EQ(rank0_, "w1");  // rank order is join order
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kNotFound, "not put it"));
  EXPECT_THAT(Put(2, rank0_, Id('a').substr(0, 127)),
              StatusIs(absl::StatusCode::kInvalidArgument, "nccl_id"));
  EXPECT_THAT(Put(2, rank0_, Id('a') + "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, "129 bytes"));
  EXPECT_THAT(Put(1, rank0_, Id('a')),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  const absl::Status not_rank0 = Put(2, other_, Id('a'));
  EXPECT_THAT(not_rank0,
              StatusIs(absl::StatusCode::kFailedPrecondition, "rank 0"));
  EXPECT_THAT(std::string(not_rank0.message()),
              HasSubstr(absl::StrCat("\"", rank0_, "\"")));
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kNotFound, "nccl_id"));

  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  EXPECT_TRUE(Put(2, rank0_, Id('a')).ok());  // same id again: a no-op
  EXPECT_THAT(Put(2, rank0_, Id('b')),
              StatusIs(absl::StatusCode::kAlreadyExists, "nccl_id"));
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('a'));
  EXPECT_THAT(Get(1).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
}

TEST_F(NcclIdTest, ACommunicatorRebuiltWithinAVersionGetsTheNextGeneration) {
  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  // The others ask for a newer one than the broken communicator's.
  EXPECT_THAT(Get(2, 1).status(),
              StatusIs(absl::StatusCode::kNotFound, "generation >= 1"));
  ASSERT_TRUE(Put(2, rank0_, Id('b'), 1).ok());
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(2, 1);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('b'));
  EXPECT_EQ(got->generation(), 1);
  // A late rank asking for any generation gets the newest.
  EXPECT_EQ(Get(2, 0)->nccl_id(), Id('b'));
  // Going back is refused; the same generation keeps its id.
  EXPECT_THAT(Put(2, rank0_, Id('c'), 0),
              StatusIs(absl::StatusCode::kFailedPrecondition, "generation"));
  EXPECT_THAT(Put(2, rank0_, Id('c'), 1),
              StatusIs(absl::StatusCode::kAlreadyExists, "nccl_id"));
  EXPECT_THAT(Put(2, rank0_, Id('c'), -1),
              StatusIs(absl::StatusCode::kInvalidArgument, "generation"));
}

TEST_F(NcclIdTest, OldVersionsIdIsNotReturnedForNewVersion) {
  ASSERT_TRUE(Put(2, rank0_, Id('a')).ok());
  EXPECT_EQ(JoinOk("x", "w3"), 3);
  EXPECT_THAT(Get(3).status(),
              StatusIs(absl::StatusCode::kNotFound, "nccl_id"));
  EXPECT_THAT(Get(2).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  EXPECT_THAT(Put(2, rank0_, Id('a')),
              StatusIs(absl::StatusCode::kFailedPrecondition, "plan_version"));
  const std::string rank0_v3 = CurrentPlan("x").workers(0);
  ASSERT_TRUE(Put(3, rank0_v3, Id('c')).ok());
  absl::StatusOr<v1::GetNcclIdResponse> got = Get(3);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->nccl_id(), Id('c'));
}

TEST_F(CoordinatorStateTest, ReportStepStatsValidatesStepTimesAndWorker) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  v1::ReportStepStatsRequest valid;
  valid.set_job("x");
  valid.set_worker_id("w1");
  valid.set_step(7);
  valid.set_plan_version(1);
  valid.set_step_seconds(0.25);
  valid.set_ns_seconds(0.125);
  valid.set_bytes_moved(1 << 20);
  EXPECT_TRUE(state_->ReportStepStats(valid).ok());

  v1::ReportStepStatsRequest r = valid;
  r.set_step(-1);
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "step: "));
  r = valid;
  r.set_step_seconds(std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "step_seconds"));
  r = valid;
  r.set_ns_seconds(std::numeric_limits<double>::infinity());
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "ns_seconds"));
  r = valid;
  r.set_bytes_moved(-1);
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kInvalidArgument, "bytes_moved"));
  r = valid;
  r.set_worker_id("w9");
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kNotFound, "\"w9\""));
  r = valid;
  r.set_job("y");
  EXPECT_THAT(state_->ReportStepStats(r),
              StatusIs(absl::StatusCode::kNotFound, "\"y\""));
}

TEST_F(CoordinatorStateTest, CountsTrackJobsWorkersAndPublishedVersions) {
  EXPECT_EQ(state_->Counts().jobs, 0);
  ASSERT_TRUE(state_->CreateJob(Create(Spec("a", 4))).ok());
  ASSERT_TRUE(state_->CreateJob(Create(Spec("b", 4))).ok());
  JoinOk("a", "w1");
  JoinOk("a", "w2");
  JoinOk("b", "w1");
  StateCounts counts = state_->Counts();
  EXPECT_EQ(counts.jobs, 2);
  EXPECT_EQ(counts.workers, 3);
  EXPECT_EQ(counts.plan_versions, 3);
  ASSERT_TRUE(state_->LeaveJob(Leave("a", "w2")).ok());
  counts = state_->Counts();
  EXPECT_EQ(counts.workers, 2);
  EXPECT_EQ(counts.plan_versions, 4);
  ASSERT_TRUE(state_->DeleteJob("a").ok());
  counts = state_->Counts();
  EXPECT_EQ(counts.jobs, 1);
  EXPECT_EQ(counts.workers, 1);
  // A running total (it feeds muonps_coordinator_plan_versions_total).
  EXPECT_EQ(counts.plan_versions, 4);
}

TEST_F(CoordinatorStateTest,
       DeletedJobIsNotFoundAndItsNameContinuesItsPlanVersions) {
  ASSERT_TRUE(state_->CreateJob(Create(Spec("x", 2))).ok());
  JoinOk("x", "w1");
  ASSERT_TRUE(state_->DeleteJob("x").ok());
  EXPECT_THAT(state_->GetJob("x").status(),
              StatusIs(absl::StatusCode::kNotFound, "\"x\" does not exist"));
  EXPECT_THAT(state_->Heartbeat(Beat("x", "w1", 1)).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"x\""));
  EXPECT_THAT(state_->GetPlan(PlanOf("x")).status(),
              StatusIs(absl::StatusCode::kNotFound, "\"x\""));
  EXPECT_THAT(state_->DeleteJob("x"),
              StatusIs(absl::StatusCode::kNotFound, "\"x\""));
  EXPECT_THAT(state_->ListJobs().jobs(), IsEmpty());
  EXPECT_THAT(state_->DeleteJob("bad/name"),
              StatusIs(absl::StatusCode::kInvalidArgument, "job"));
  // The name is free again; its versions continue after the deleted job's,
  // so a worker still on the old job's plan never takes the new job's for
  // an older one.
  absl::StatusOr<v1::Job> again = state_->CreateJob(Create(Spec("x", 2)));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->plan_version(), 1);
  EXPECT_EQ(JoinOk("x", "w1"), 2);
}

TEST_F(CoordinatorStateTest, WorkerCallsNeedTheTokenJoinJobGaveThatWorker) {
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
  EXPECT_THAT(state_->LeaveJob(leave),
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

TEST_F(CoordinatorStateTest, JoinRetryKeepsTheTokenTakeoverGetsANewOne) {
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

TEST_F(CoordinatorStateTest, DeleteJobNeedsTheJobsOwnToken) {
  absl::StatusOr<v1::Job> x = state_->CreateJob(Create(Spec("x", 2), "r"));
  absl::StatusOr<v1::Job> y = state_->CreateJob(Create(Spec("y", 2)));
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->job_token().size(), 64u);
  // GetJob never shows it; a retry of the create does.
  EXPECT_EQ(state_->GetJob("x")->job_token(), "");
  EXPECT_EQ(state_->CreateJob(Create(Spec("x", 2), "r"))->job_token(),
            x->job_token());
  v1::DeleteJobRequest r;
  r.set_job("x");
  EXPECT_THAT(state_->DeleteJob(r),
              StatusIs(absl::StatusCode::kUnauthenticated, "job_token"));
  r.set_job_token(y->job_token());
  EXPECT_THAT(state_->DeleteJob(r),
              StatusIs(absl::StatusCode::kUnauthenticated, "job_token"));
  EXPECT_TRUE(state_->GetJob("x").ok());
  r.set_job_token(x->job_token());
  EXPECT_TRUE(state_->DeleteJob(r).ok());
}

TEST_F(NcclIdTest, OnlyRankZeroWithItsOwnTokenPutsAndOnlyMembersGet) {
  v1::PutNcclIdRequest put;
  put.set_job("x");
  put.set_plan_version(2);
  put.set_worker_id(rank0_);
  put.set_nccl_id(Id('a'));
  // Naming rank 0 with another worker's token does not make one rank 0.
  put.set_worker_token(state_->worker_token("x", other_));
  EXPECT_THAT(state_->PutNcclId(put),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  put.set_worker_token(state_->worker_token("x", rank0_));
  ASSERT_TRUE(state_->PutNcclId(put).ok());

  v1::GetNcclIdRequest get;
  get.set_job("x");
  get.set_plan_version(2);
  get.set_worker_id(other_);
  get.set_worker_token("ffffffffffffffffffffffffffffffff");
  EXPECT_THAT(state_->GetNcclId(get).status(),
              StatusIs(absl::StatusCode::kUnauthenticated, "worker_token"));
  get.set_worker_id("stranger");
  get.clear_worker_token();
  EXPECT_THAT(state_->GetNcclId(get).status(),
              StatusIs(absl::StatusCode::kNotFound, "worker_id"));
}

}  // namespace
}  // namespace coordinator
}  // namespace muonps
