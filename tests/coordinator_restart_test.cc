// The coordinator killed with SIGKILL and restarted, with real processes on
// loopback (a coordinator, two CPU workers, two trainer ranks stepping a
// model of every layout). Proves that with --state_dir a coordinator killed
// while steps run and restarted on the same directory and port loses no
// step: every step completes, the plan version does not move (no lease is
// lost, no momentum moves), and the parameters and momentum equal a
// failure-free replay; that a second coordinator on the directory exits
// naming it; and that without --state_dir (the job is gone) the workers
// refuse steps with a named error instead of stepping on a plan the
// coordinator no longer has, then follow the plan of the job created again
// though its versions restarted below theirs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/grpc_status.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace {

using testing::ChildProcess;
using testing::ClusterOptions;
using testing::DataPlaneFixture;
using testing::MixedModel;
using testing::ModelDecl;
using testing::ReferenceModel;
using testing::StepOutcome;

constexpr int kWorkers = 2;
constexpr int64_t kLeaseTtlMs = 3000;
constexpr absl::Duration kWait = absl::Seconds(20);

using Outcomes = std::vector<std::optional<StepOutcome>>;

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

class CoordinatorRestartTest : public DataPlaneFixture {
 protected:
  CoordinatorRestartTest() : root_(testing::NewTempDir("coordinator_state")) {}
  ~CoordinatorRestartTest() override {
    std::error_code ignored;
    if (!root_.empty()) std::filesystem::remove_all(root_, ignored);
  }

  ClusterOptions Cluster(bool durable) const {
    return {.workers = kWorkers,
            .io_timeout_ms = 5000,
            .lease_ttl_ms = kLeaseTtlMs,
            .heartbeat_interval_ms = 300,
            .state_dir = durable ? root_ + "/state" : ""};
  }

  absl::StatusOr<v1::Plan> CurrentPlan() {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(5)));
    v1::GetPlanRequest request;
    request.set_job(job());
    v1::Plan plan;
    const grpc::Status s = coordinator_stub().GetPlan(&context, request, &plan);
    if (!s.ok()) return FromGrpc(s, "GetPlan");
    return plan;
  }

  // Waits until every worker is "ready" on the coordinator's current plan,
  // which holds them all; returns that plan.
  absl::StatusOr<v1::Plan> WaitUntilWorkersFollowTheCoordinator() {
    const absl::Time deadline = absl::Now() + kWait;
    std::string last = "nothing yet";
    while (absl::Now() < deadline) {
      absl::StatusOr<v1::Plan> plan = CurrentPlan();
      bool all = plan.ok() && plan->workers_size() == kWorkers;
      last = plan.ok() ? absl::StrCat("plan_version ", plan->version(), " of ",
                                      plan->workers_size(), " workers")
                       : plan.status().ToString();
      for (int w = 0; all && w < kWorkers; ++w) {
        absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(w);
        all = status.ok() && status->state() == "ready" &&
              status->plan_version() == plan->version();
        if (!all) {
          last = absl::StrCat("coordinator at plan_version ", plan->version(),
                              "; worker ", w, ": ",
                              status.ok() ? status->ShortDebugString()
                                          : status.status().ToString());
        }
      }
      if (all) return plan;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return absl::DeadlineExceededError(last);
  }

  const std::string root_;
};

TEST_F(CoordinatorRestartTest,
       KilledMidTrainingAndRestartedOnItsStateDirItLosesNoStep) {
  const ModelDecl model = MixedModel();
  ASSERT_NO_FATAL_FAILURE(StartJob(model, Cluster(/*durable=*/true)));
  ReferenceModel reference(model, kWorkers, PlannedAlgorithms());
  const int64_t version = plan().version();

  // Steps run back to back (a few ms apart) until eight more have run
  // after the restart.
  std::vector<Outcomes> outcomes(1);
  std::atomic<int64_t> running{0};
  std::atomic<bool> restarted{false};
  std::thread training([&] {
    int after_restart = 0;
    for (int64_t step = 1; step <= 2000 && after_restart < 8; ++step) {
      running = step;
      outcomes.push_back(RunStep(step));
      if (restarted) ++after_restart;
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  // Kill it while steps run, keep it down a while (steps go on), restart it
  // on the same directory and port.
  while (running < 4) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_NO_FATAL_FAILURE(KillCoordinator());
  const int64_t killed_at = running;
  absl::SleepFor(absl::Milliseconds(800));
  const int64_t restarted_at = running;
  ASSERT_NO_FATAL_FAILURE(RestartCoordinator());
  restarted = true;
  training.join();
  EXPECT_GT(restarted_at, killed_at) << "no step ran while it was down";

  const int64_t steps = static_cast<int64_t>(outcomes.size()) - 1;
  for (int64_t step = 1; step <= steps; ++step) {
    for (int r = 0; r < kWorkers; ++r) {
      ASSERT_TRUE(outcomes[step][r].has_value());
      const absl::StatusOr<StepResult>& result = outcomes[step][r]->result;
      ASSERT_TRUE(result.ok())
          << "step " << step << " trainer " << r << ": " << result.status();
      EXPECT_FALSE(result->already_applied) << "step " << step;
      EXPECT_EQ(result->momentum_reset, 0) << "step " << step;
      EXPECT_EQ(result->plan_version, version) << "step " << step;
    }
    ASSERT_TRUE(reference.Step(step).ok());
  }
  // Bit for bit the failure-free replay: no step was lost or repeated and
  // no momentum moved.
  ExpectMatchesReference(reference, 0.0);

  // The restarted coordinator has the job, both members and the plan.
  EXPECT_TRUE(absl::StrContains(coordinator_process().Log(),
                                "restored 1 jobs, 2 workers"))
      << coordinator_process().Log();
  absl::StatusOr<v1::Plan> after = WaitUntilWorkersFollowTheCoordinator();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version(), version);
  EXPECT_FALSE(absl::StrContains(coordinator_process().Log(), "expired"))
      << coordinator_process().Log();
}

TEST_F(CoordinatorRestartTest, ASecondCoordinatorOnTheStateDirExitsNamingIt) {
  const std::string dir = root_ + "/state";
  std::vector<std::string> argv = {
      testing::RunfilePath("server/coordinator/muonps-coordinator"), "--port=0",
      "--metrics_port=-1", "--state_dir=" + dir};
  for (std::string& flag : testing::SecuredCoordinatorFlags()) {
    argv.push_back(std::move(flag));
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> first =
      ChildProcess::Start(argv, root_ + "/first.log");
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->WaitForLog("listening on", kWait).ok());

  absl::StatusOr<std::unique_ptr<ChildProcess>> second =
      ChildProcess::Start(argv, root_ + "/second.log");
  ASSERT_TRUE(second.ok()) << second.status();
  const absl::StatusOr<int> exited = (*second)->Wait(kWait);
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 2) << *exited;
  EXPECT_TRUE(absl::StrContains(
      (*second)->Log(),
      absl::StrCat("state_dir: \"", dir,
                   "\" is locked by another muonps-coordinator (pid ",
                   (*first)->pid(), ")")))
      << (*second)->Log();
  EXPECT_TRUE((*first)->running());

  // kill -9 releases the lock: the next one starts.
  (*first)->Signal(SIGKILL);
  ASSERT_TRUE((*first)->Wait(kWait).ok());
  absl::StatusOr<std::unique_ptr<ChildProcess>> third =
      ChildProcess::Start(argv, root_ + "/third.log");
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE((*third)->WaitForLog("listening on", kWait).ok())
      << (*third)->Log();
}

TEST_F(CoordinatorRestartTest,
       RestartedWithoutStateWorkersRefuseStepsThenFollowTheNewJobsPlan) {
  ASSERT_NO_FATAL_FAILURE(StartJob(MixedModel(), Cluster(/*durable=*/false)));
  ASSERT_TRUE(RunStep(1)[0]->result.ok());
  // A dedicated worker joins and leaves, twice (a rank: one with no trainer
  // and not dedicated would be a standby, planned in no version), so the
  // workers follow version 5 or above (the two workers' joins publish one
  // version or two, as they land), above anything the restarted coordinator
  // will publish for a while.
  for (int round = 0; round < 2; ++round) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(10)));
    v1::JoinJobRequest join;
    join.set_job(job());
    join.set_worker_id("passer-by");
    join.set_instance_id(absl::StrCat("p", round));
    join.mutable_device()->set_kind("cpu");
    join.mutable_device()->set_memory_bytes(int64_t{8} << 30);
    join.set_data_address("127.0.0.1:1");
    join.set_dedicated(true);
    v1::JoinJobResponse joined;
    ASSERT_TRUE(coordinator_stub().JoinJob(&context, join, &joined).ok());
    grpc::ClientContext leave_context;
    leave_context.set_deadline(Deadline(absl::Seconds(10)));
    v1::LeaveJobRequest leave;
    leave.set_job(job());
    leave.set_worker_id("passer-by");
    leave.set_instance_id(absl::StrCat("p", round));
    leave.set_worker_token(joined.worker_token());
    v1::LeaveJobResponse left;
    ASSERT_TRUE(coordinator_stub().LeaveJob(&leave_context, leave, &left).ok());
  }
  absl::StatusOr<v1::Plan> before = WaitUntilWorkersFollowTheCoordinator();
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_GE(before->version(), 5);
  const Outcomes on_before = RunStep(2);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(on_before[r]->result.ok()) << on_before[r]->result.status();
  }
  v1::Job job_before;
  {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(5)));
    v1::GetJobRequest get;
    get.set_job(job());
    ASSERT_TRUE(coordinator_stub().GetJob(&context, get, &job_before).ok());
  }

  // Restarted without state: the job is gone.
  ASSERT_NO_FATAL_FAILURE(KillCoordinator());
  ASSERT_NO_FATAL_FAILURE(RestartCoordinator());
  const absl::Time deadline = absl::Now() + kWait;
  for (int w = 0; w < kWorkers; ++w) {
    absl::StatusOr<v1::WorkerStatus> status = WorkerStatus(w);
    while (absl::Now() < deadline && status.ok() &&
           status->state() == "ready") {
      absl::SleepFor(absl::Milliseconds(20));
      status = WorkerStatus(w);
    }
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_NE(status->state(), "ready") << "worker " << w << " never noticed";
  }
  // No step on the plan the coordinator no longer has: a named error at
  // once (well within the lease), on every rank.
  const Outcomes refused = RunStep(3);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(refused[r].has_value());
    const absl::Status& status = refused[r]->result.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable)
        << "trainer " << r << ": " << status;
    EXPECT_TRUE(absl::StrContains(status.message(), "lost its lease"))
        << "trainer " << r << ": " << status;
    EXPECT_LT(refused[r]->elapsed, absl::Milliseconds(kLeaseTtlMs));
  }

  // An operator creates the job again: the workers join it and follow its
  // plan, though its versions start over below their old one.
  {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(10)));
    v1::CreateJobRequest create;
    create.set_request_id("again");
    *create.mutable_job() = job_before.spec();
    v1::Job created;
    ASSERT_TRUE(coordinator_stub().CreateJob(&context, create, &created).ok());
  }
  absl::StatusOr<v1::Plan> after = WaitUntilWorkersFollowTheCoordinator();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_LT(after->version(), before->version());
  const Outcomes resumed = RunStep(3);
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_TRUE(resumed[r]->result.ok())
        << "trainer " << r << ": " << resumed[r]->result.status();
    EXPECT_EQ(resumed[r]->result->plan_version, after->version());
  }
}

}  // namespace
}  // namespace muonps
