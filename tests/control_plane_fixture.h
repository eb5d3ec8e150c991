// Shared setup of the control-plane tests (control_plane_replan_test,
// control_plane_watch_plan_test, control_plane_worker_token_test): one
// muonps-coordinator with short leases and the job TinyMoeSpec() created,
// muonps-worker daemons started on demand on loopback, and the checks of a
// plan (ItemsOf, ExpectCompletePlan). Every process, socket and log a test
// starts is removed when it ends; a failed test prints the processes' logs.
// Tests only (testonly in BUILD).
#ifndef MUONPS_TESTS_CONTROL_PLANE_FIXTURE_H_
#define MUONPS_TESTS_CONTROL_PLANE_FIXTURE_H_

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace control_plane_test {

using ::muonps::testing::ChildProcess;
using ::muonps::testing::NewTempDir;
using ::muonps::testing::RunfilePath;

constexpr char kJob[] = "tiny-moe";
constexpr int64_t kLeaseTtlMs = 1500;
constexpr int64_t kHeartbeatMs = 300;
constexpr int64_t kWorkerMemoryBytes = int64_t{16} << 30;
constexpr absl::Duration kLeaseTtl = absl::Milliseconds(kLeaseTtlMs);
constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kWaitTimeout = absl::Seconds(15);

// DeadlineIn(d): a gRPC deadline `d` from now.
std::chrono::system_clock::time_point Deadline(absl::Duration d);

// The absl status of a gRPC one (::muonps::FromGrpc, no context).
absl::Status FromGrpc(const grpc::Status& s);

// Eight layers of a small MoE transformer: square and rectangular attention
// shapes, dense MLPs on even layers, 8-expert stacks on odd ones, and every
// layout and dtype a trainer may register.
v1::JobSpec TinyMoeSpec();

// Every owned item of a plan ("name" or "name[expert]") with its owner and
// fp32 momentum bytes.
struct Item {
  std::string owner;
  int64_t momentum_bytes;
};
std::map<std::string, Item> ItemsOf(const v1::Plan& plan);

// The workers of `plan`.
std::set<std::string> WorkersOf(const v1::Plan& plan);

// The fp32 momentum bytes `plan` gives `worker_id`; -1 if it has no load.
int64_t MomentumOf(const v1::Plan& plan, const std::string& worker_id);

// Whether a ChildProcess::Wait result is a normal exit with status 0.
bool ExitedZero(const absl::StatusOr<int>& wait_status);

// A plan for `workers` owns every matrix of TinyMoeSpec() once (every expert
// of a stack separately) by one of them, batches and buckets each exactly
// once, and its loads and bounds are consistent.
void ExpectCompletePlan(const v1::Plan& plan,
                        const std::set<std::string>& workers);

// A coordinator with short leases, the job created, and workers started on
// demand; every process, socket and log is removed when the test ends.
class ControlPlaneTest : public ::testing::Test {
 protected:
  struct Worker {
    std::string socket;
    std::unique_ptr<ChildProcess> process;
    int metrics_port = 0;
  };

  ~ControlPlaneTest() override {
    for (auto& [id, worker] : workers_) {
      worker.process.reset();  // SIGKILLs it if it still runs
    }
    coordinator_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    if (!socket_dir_.empty()) std::filesystem::remove_all(socket_dir_);
  }

  void SetUp() override {
    dir_ = NewTempDir("control_plane");
    ASSERT_FALSE(dir_.empty());
    // Unix socket paths hold at most 108 bytes, too few for TEST_TMPDIR; and
    // sandboxed runs share /tmp while their pids coincide, so mkdtemp.
    std::string socket_dir = "/tmp/muonps-test-XXXXXX";
    ASSERT_NE(mkdtemp(socket_dir.data()), nullptr);
    socket_dir_ = socket_dir;
    std::vector<std::string> argv = {
        RunfilePath("server/coordinator/muonps-coordinator"), "--port=0",
        "--metrics_port=0", absl::StrCat("--lease_ttl_ms=", kLeaseTtlMs),
        absl::StrCat("--heartbeat_interval_ms=", kHeartbeatMs)};
    for (std::string& flag : testing::SecuredCoordinatorFlags()) {
      argv.push_back(std::move(flag));
    }
    absl::StatusOr<std::unique_ptr<ChildProcess>> started =
        ChildProcess::Start(argv, dir_ + "/coordinator.log");
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    absl::StatusOr<std::string> port = coordinator_->WaitForLog(
        R"(listening on 127\.0\.0\.1:(\d+))", kStartTimeout);
    ASSERT_TRUE(port.ok()) << port.status();
    absl::StatusOr<std::string> metrics = coordinator_->WaitForLog(
        R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", kStartTimeout);
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    ASSERT_TRUE(absl::SimpleAtoi(*metrics, &metrics_port_));
    address_ = absl::StrCat("127.0.0.1:", *port);
    stub_ = v1::Coordinator::NewStub(testing::TestChannel(address_));

    v1::CreateJobRequest request;
    request.set_request_id("control-plane-test-create");
    *request.mutable_job() = TinyMoeSpec();
    absl::StatusOr<v1::Job> job =
        Call(&v1::Coordinator::Stub::CreateJob, request);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->name(), absl::StrCat("jobs/", kJob));
    EXPECT_EQ(job->plan_version(), 0);
  }

  void TearDown() override {
    if (!HasFailure()) return;
    if (coordinator_)
      std::cerr << "== coordinator log\n" << coordinator_->Log();
    for (const auto& [id, worker] : workers_) {
      if (worker.process)
        std::cerr << "== " << id << " log\n" << worker.process->Log();
    }
  }

  // Starts (or restarts) worker `id` and waits until it serves.
  void StartWorker(const std::string& id) {
    Worker& w = workers_[id];
    w.socket = absl::StrCat(socket_dir_, "/", id, ".sock");
    const std::string log =
        absl::StrCat(dir_, "/", id, "-", restarts_++, ".log");
    absl::StatusOr<std::unique_ptr<ChildProcess>> started = ChildProcess::Start(
        {RunfilePath("server/worker/muonps-worker"),
         "--coordinator=" + address_, absl::StrCat("--job=", kJob),
         "--worker_id=" + id, "--socket=" + w.socket, "--metrics_port=0",
         "--device=cpu", absl::StrCat("--memory_bytes=", kWorkerMemoryBytes)},
        log);
    ASSERT_TRUE(started.ok()) << started.status();
    w.process = *std::move(started);
    ASSERT_TRUE(
        w.process->WaitForLog("listening on unix:", kStartTimeout).ok());
    absl::StatusOr<std::string> port = w.process->WaitForLog(
        R"(metrics on http://127\.0\.0\.1:(\d+)/metrics)", kStartTimeout);
    ASSERT_TRUE(port.ok()) << port.status();
    ASSERT_TRUE(absl::SimpleAtoi(*port, &w.metrics_port));
  }

  // A unary Coordinator call with a deadline.
  template <typename Request, typename Response>
  absl::StatusOr<Response> Call(
      grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                    const Request&, Response*),
      const Request& request) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(5)));
    Response response;
    const grpc::Status status =
        (stub_.get()->*method)(&context, request, &response);
    if (!status.ok()) return FromGrpc(status);
    return response;
  }

  absl::StatusOr<v1::Plan> GetPlan(int64_t version) {
    v1::GetPlanRequest request;
    request.set_job(kJob);
    request.set_version(version);
    return Call(&v1::Coordinator::Stub::GetPlan, request);
  }

  // Polls the latest plan until its workers are exactly `workers`.
  absl::StatusOr<v1::Plan> WaitForPlanOf(const std::set<std::string>& workers,
                                         absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::StatusOr<v1::Plan> plan;
    while (absl::Now() < deadline) {
      plan = GetPlan(0);
      if (plan.ok() && WorkersOf(*plan) == workers) return plan;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("no plan of [", absl::StrJoin(workers, ","), "]; last: ",
                     plan.ok() ? plan->ShortDebugString().substr(0, 300)
                               : plan.status().ToString()));
  }

  absl::StatusOr<v1::ListWorkersResponse> ListWorkers() {
    v1::ListWorkersRequest request;
    request.set_job(kJob);
    return Call(&v1::Coordinator::Stub::ListWorkers, request);
  }

  // Polls the worker's local control service until it is ready on
  // `version`.
  absl::StatusOr<v1::WorkerStatus> WaitForWorker(const std::string& id,
                                                 int64_t version) {
    std::unique_ptr<v1::Worker::Stub> stub = v1::Worker::NewStub(
        testing::TestChannel("unix:" + workers_.at(id).socket));
    const absl::Time deadline = absl::Now() + kWaitTimeout;
    v1::WorkerStatus status;
    grpc::Status rpc;
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      context.set_deadline(Deadline(absl::Seconds(2)));
      rpc = stub->GetStatus(&context, v1::GetStatusRequest(), &status);
      if (rpc.ok() && status.state() == "ready" &&
          status.plan_version() == version) {
        return status;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return absl::DeadlineExceededError(
        absl::StrCat(id, " is not ready on plan_version ", version, ": ",
                     rpc.error_message(), " ", status.ShortDebugString()));
  }

  // The worker's view agrees with `plan`: ready, its rank, what it owns.
  void ExpectWorkerFollows(const std::string& id, const v1::Plan& plan) {
    absl::StatusOr<v1::WorkerStatus> status = WaitForWorker(id, plan.version());
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->worker_id(), id);
    EXPECT_EQ(status->job(), kJob);
    EXPECT_EQ(status->coordinator(), address_);
    const auto rank =
        std::find(plan.workers().begin(), plan.workers().end(), id);
    ASSERT_NE(rank, plan.workers().end());
    EXPECT_EQ(status->rank(), rank - plan.workers().begin());
    int64_t owned = 0;
    for (const auto& [name, item] : ItemsOf(plan)) owned += item.owner == id;
    EXPECT_EQ(status->owned_matrices(), owned);
    EXPECT_EQ(status->owned_momentum_bytes(), MomentumOf(plan, id));
  }

  std::string dir_;         // logs
  std::string socket_dir_;  // under /tmp
  std::unique_ptr<ChildProcess> coordinator_;
  std::string address_;
  int metrics_port_ = 0;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::map<std::string, Worker> workers_;
  int restarts_ = 0;
};

}  // namespace control_plane_test
}  // namespace muonps

#endif  // MUONPS_TESTS_CONTROL_PLANE_FIXTURE_H_
