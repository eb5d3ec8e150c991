// A GPU worker's NCCL bootstrap when the job's plan changes under it, with
// a real muonps-coordinator: the plan version a worker is building its
// communicator for was replaced (a worker joined, as a restarted one does
// once the killed instance's lease ends). Rank 0's PutNcclId and a peer's
// GetNcclId are refused as not current; the worker's TransportFactory says
// UNAVAILABLE at once, naming both versions, so the trainer retries the
// step on the new plan (FAILED_PRECONDITION would tell it that no retry
// helps). No GPU: neither rank gets as far as building a communicator.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "server/worker/join_credentials.h"
#include "server/worker/nccl_bootstrap.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

std::chrono::system_clock::time_point Soon() {
  return std::chrono::system_clock::now() + std::chrono::seconds(10);
}

class NcclBootstrapPlanChangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::NewTempDir("nccl-bootstrap-plan-change");
    // Leases that outlast the test: only the joins below change the plan.
    absl::StatusOr<testing::RunningCoordinator> started =
        testing::StartCoordinator(
            dir_ + "/coordinator.log", absl::Seconds(30),
            {"--lease_ttl_ms=600000", "--heartbeat_interval_ms=10000"});
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = *std::move(started);
    channel_ = testing::TestChannel(coordinator_.address);
    stub_ = v1::Coordinator::NewStub(channel_);
    grpc::ClientContext context;
    context.set_deadline(Soon());
    v1::CreateJobRequest create;
    create.mutable_job()->set_name("boot");
    for (int i = 0; i < 4; ++i) {
      v1::Matrix* m = create.mutable_job()->add_matrices();
      m->set_name(absl::StrCat("layers.", i, ".w"));
      m->set_rows(256);
      m->set_cols(256);
      m->set_layer(i);
    }
    v1::Job job;
    const grpc::Status status = stub_->CreateJob(&context, create, &job);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  void TearDown() override {
    coordinator_.process.reset();  // killed and reaped
    std::filesystem::remove_all(dir_);
  }

  // Joins `worker` as a GPU worker; returns the plan version it was given.
  int64_t Join(const std::string& worker) {
    v1::JoinJobRequest join;
    join.set_job("boot");
    join.set_worker_id(worker);
    join.set_instance_id("i-" + worker);
    join.mutable_device()->set_kind("cuda");
    join.mutable_device()->set_memory_bytes(int64_t{80} << 30);
    join.set_data_address("127.0.0.1:1");
    v1::JoinJobResponse joined;
    grpc::ClientContext context;
    context.set_deadline(Soon());
    const grpc::Status status = stub_->JoinJob(&context, join, &joined);
    EXPECT_TRUE(status.ok()) << worker << ": " << status.error_message();
    tokens_[worker] = joined.worker_token();
    return joined.plan_version();
  }

  v1::Plan Plan(int64_t version) {
    v1::GetPlanRequest get;
    get.set_job("boot");
    get.set_version(version);
    v1::Plan plan;
    grpc::ClientContext context;
    context.set_deadline(Soon());
    const grpc::Status status = stub_->GetPlan(&context, get, &plan);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return plan;
  }

  // The factory of `worker`'s bootstrap, as its daemon makes it.
  worker::TransportFactory FactoryOf(const std::string& worker) {
    auto credentials = std::make_shared<worker::JoinCredentials>();
    credentials->Set(tokens_[worker], "");
    return worker::NcclTransportFactory({.coordinator = channel_,
                                         .job = "boot",
                                         .worker_id = worker,
                                         .credentials = credentials,
                                         .cuda_device = 0,
                                         .timeout = kTimeout});
  }

  static constexpr absl::Duration kTimeout = absl::Seconds(10);
  std::string dir_;
  testing::RunningCoordinator coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::map<std::string, std::string> tokens_;
};

TEST_F(NcclBootstrapPlanChangeTest, AReplacedPlanVersionIsARetryNotARefusal) {
  Join("w0");
  const int64_t old_version = Join("w1");
  const v1::Plan old_plan = Plan(old_version);
  ASSERT_EQ(old_plan.workers_size(), 2);
  const std::vector<std::string> addresses = {"127.0.0.1:1", "127.0.0.1:2"};
  // A third worker joins: the plan the two were to build for is replaced.
  const int64_t new_version = Join("w2");
  ASSERT_GT(new_version, old_version);

  for (int rank : {1, 0}) {
    const std::string worker = old_plan.workers(rank);
    const absl::Time start = absl::Now();
    const absl::StatusOr<std::unique_ptr<transport::Transport>> built =
        FactoryOf(worker)(rank, addresses, static_cast<uint64_t>(old_version),
                          "");
    const absl::Duration took = absl::Now() - start;
    ASSERT_FALSE(built.ok()) << worker;
    const std::string message(built.status().message());
    EXPECT_TRUE(absl::IsUnavailable(built.status()))
        << worker << " (rank " << rank << "): " << built.status();
    EXPECT_TRUE(absl::StrContains(
        message, absl::StrCat(rank == 0 ? "PutNcclId" : "GetNcclId",
                              " for plan version ", old_version)))
        << message;
    EXPECT_TRUE(absl::StrContains(
        message, absl::StrCat("not the current ", new_version)))
        << message;
    EXPECT_TRUE(absl::StrContains(message, "retry it on the new plan"))
        << message;
    // At once, not after waiting out the bootstrap's timeout for an id
    // that will never come.
    EXPECT_LT(took, kTimeout / 4) << worker;
  }
}

}  // namespace
}  // namespace muonps
