// What the coordinator's tests share: CredentialedState (a
// ServedCoordinator whose callers keep the tokens it hands out), builders
// of specs and requests, the StatusIs matcher, and the CoordinatorTest
// fixture on a FakeClock. Tests only (testonly in BUILD).
#ifndef MUONPS_SERVER_COORDINATOR_COORDINATOR_FIXTURE_H_
#define MUONPS_SERVER_COORDINATOR_COORDINATOR_FIXTURE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/fake_clock.h"
#include "server/coordinator/served_coordinator.h"

namespace muonps {
namespace coordinator {
namespace coordinator_test {

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr absl::Duration kTtl = absl::Seconds(10);

// The status has `code` and a message containing `part`.
MATCHER_P2(StatusIs, code, part, "") {
  *result_listener << "status is " << arg;
  return arg.code() == code &&
         std::string(arg.message()).find(part) != std::string::npos;
}

// A ServedCoordinator whose callers hold the credentials it hands out, as
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
  absl::StatusOr<v1::LeaveJobResponse> LeaveJob(v1::LeaveJobRequest r) {
    return state_.LeaveJob(WithToken(std::move(r)));
  }
  absl::StatusOr<v1::DrainWorkerResponse> DrainWorker(
      const v1::DrainWorkerRequest& r) {
    return state_.DrainWorker(r);
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
  // Below the service edge: calls with what only the edge sets (a call's
  // client certificate).
  Coordinator& core() { return state_.coordinator(); }
  StateCounts Counts() { return state_.Counts(); }
  const std::string& job_token(const std::string& job) {
    return job_tokens_[job];
  }
  const std::string& worker_token(const std::string& job,
                                  const std::string& worker) {
    return worker_tokens_[{job, worker}];
  }

 private:
  ServedCoordinator state_;
  std::map<std::string, std::string> job_tokens_;
  std::map<std::pair<std::string, std::string>, std::string> worker_tokens_;
};

// `count` fp32 matrices of rows x cols (4 MiB of momentum each by default),
// one per layer.
inline v1::JobSpec Spec(const std::string& name, int count, int64_t rows = 1024,
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

inline v1::CreateJobRequest Create(const v1::JobSpec& spec,
                                   const std::string& request_id = "") {
  v1::CreateJobRequest r;
  r.set_request_id(request_id);
  *r.mutable_job() = spec;
  return r;
}

inline v1::JoinJobRequest Join(const std::string& job,
                               const std::string& worker,
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

inline v1::HeartbeatRequest Beat(const std::string& job,
                                 const std::string& worker,
                                 int64_t plan_version,
                                 const std::string& instance = "") {
  v1::HeartbeatRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id(instance.empty() ? "i-" + worker : instance);
  r.set_plan_version(plan_version);
  return r;
}

inline v1::LeaveJobRequest Leave(const std::string& job,
                                 const std::string& worker) {
  v1::LeaveJobRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id("i-" + worker);
  return r;
}

inline v1::GetPlanRequest PlanOf(const std::string& job, int64_t version = 0) {
  v1::GetPlanRequest r;
  r.set_job(job);
  r.set_version(version);
  return r;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest() { Reset(Options()); }

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
  // A heartbeat of `worker` (following the current plan) whose trainer is
  // `trainer_rank` (none: no trainer).
  void BeatWithTrainer(const std::string& job, const std::string& worker,
                       std::optional<int> trainer_rank,
                       const std::string& token = "") {
    v1::HeartbeatRequest r = Beat(job, worker, CurrentPlan(job).version());
    r.set_worker_token(token);
    r.set_has_trainer(trainer_rank.has_value());
    if (trainer_rank.has_value()) r.set_trainer_rank(*trainer_rank);
    const absl::StatusOr<v1::HeartbeatResponse> beat = state_->Heartbeat(r);
    EXPECT_TRUE(beat.ok()) << worker << ": " << beat.status();
  }
  // What the lease monitor plans (a heartbeat's change).
  v1::Plan Monitored(const std::string& job) {
    state_->ExpireLeases();
    return CurrentPlan(job);
  }

  FakeClock clock_;
  std::unique_ptr<CredentialedState> state_;
};

}  // namespace coordinator_test
}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_COORDINATOR_FIXTURE_H_
