// Shared setup of the coordinator bad-input tests
// (coordinator_bad_input_rpcs_test, coordinator_bad_input_token_test): one
// real muonps-coordinator with small limits (10 matrices and 2 workers a
// job, 3 jobs, 4 watch streams, 1 MB messages), TLS and a bearer token; raw
// and typed calls to it; and the jobs the requests run against ("keep",
// "boot", "idle"). The coordinator must stop cleanly on SIGTERM when a test
// ends. Tests only (testonly in BUILD).
#ifndef MUONPS_TESTS_COORDINATOR_BAD_INPUT_FIXTURE_H_
#define MUONPS_TESTS_COORDINATOR_BAD_INPUT_FIXTURE_H_

#include <google/protobuf/message.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "tests/harness/child_process.h"
#include "tests/harness/raw_unary_call.h"

namespace muonps {
namespace bad_input_test {

using grpc::StatusCode;
using ::muonps::testing::ChildProcess;

// An ncclUniqueId-sized id: 128 bytes of `fill`.
std::string NcclId(char fill);

// A gRPC deadline 10 s from now.
std::chrono::system_clock::time_point Deadline();

// The message's bytes, serialized deterministically, for comparisons.
std::string Deterministic(const google::protobuf::Message& message);

// A valid request of each kind, which rows then break in one place.
v1::CreateJobRequest ValidCreate(const std::string& name);

v1::JoinJobRequest ValidJoin(const std::string& job, const std::string& worker,
                             const std::string& instance);

// One request and what the coordinator must answer.
struct Row {
  std::string what;
  std::string method;   // a muonps.v1.Coordinator method
  std::string request;  // wire bytes
  StatusCode code;
  // The status message must contain this: the field, or for rows gRPC
  // itself answers (naming no field) its wording or "".
  std::string needle;
  // Unparseable bytes: INTERNAL and INVALID_ARGUMENT are both right.
  bool malformed = false;
  // For OK rows: checks the response bytes.
  std::function<void(const std::string&)> check_response;
};

class CoordinatorBadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::NewTempDir("bad-input");
    ASSERT_FALSE(dir_.empty());
    std::vector<std::string> argv = {
        testing::RunfilePath("server/coordinator/muonps-coordinator"),
        "--port=0",
        "--metrics_port=-1",
        "--lease_ttl_ms=60000",
        "--max_message_bytes=1000000",
        "--max_matrices_per_job=10",
        "--max_workers_per_job=2",
        "--max_jobs=3",
        "--max_watch_streams=4"};
    for (std::string& flag : testing::SecuredCoordinatorFlags()) {
      argv.push_back(std::move(flag));
    }
    auto child = ChildProcess::Start(argv, dir_ + "/coordinator.log");
    ASSERT_TRUE(child.ok()) << child.status();
    coordinator_ = *std::move(child);
    auto port = coordinator_->WaitForLog("listening on [^:]+:([0-9]+)",
                                         absl::Seconds(30));
    ASSERT_TRUE(port.ok()) << port.status();
    address_ = absl::StrCat("127.0.0.1:", *port);
    channel_ = testing::TestChannel(address_);
    stub_ = v1::Coordinator::NewStub(channel_);
  }

  void TearDown() override {
    if (coordinator_ != nullptr) {
      coordinator_->Signal(SIGTERM);
      auto status = coordinator_->Wait(absl::Seconds(10));
      EXPECT_TRUE(status.ok() && WIFEXITED(*status) &&
                  WEXITSTATUS(*status) == 0)
          << "coordinator did not stop cleanly; log:\n"
          << coordinator_->Log();
    }
    std::filesystem::remove_all(dir_);
  }

  // Calls `method` with raw request bytes; fills `response` on success.
  grpc::Status Call(const std::string& method, const std::string& request,
                    std::string* response,
                    const std::string& service = "muonps.v1.Coordinator",
                    std::shared_ptr<grpc::Channel> channel = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    return testing::RawUnaryCall(channel ? channel : channel_, &context,
                                 absl::StrCat("/", service, "/", method),
                                 request, response);
  }

  // WatchPlan streams; a refused watch must end before sending any plan.
  grpc::Status Watch(const std::string& request, int* plans) {
    v1::WatchPlanRequest r;
    EXPECT_TRUE(r.ParseFromString(request));
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    auto reader = stub_->WatchPlan(&context, r);
    v1::Plan plan;
    for (*plans = 0; reader->Read(&plan);) ++*plans;
    return reader->Finish();
  }

  // Typed calls for setup, which must succeed.
  template <typename Request, typename Response>
  Response Ok(const std::string& method, const Request& request) {
    std::string bytes;
    const grpc::Status status =
        Call(method, request.SerializeAsString(), &bytes);
    EXPECT_TRUE(status.ok()) << method << ": " << status.error_message();
    Response response;
    EXPECT_TRUE(response.ParseFromString(bytes));
    return response;
  }

  v1::Job KeepJob() {
    v1::GetJobRequest r;
    r.set_job("keep");
    return Ok<v1::GetJobRequest, v1::Job>("GetJob", r);
  }
  v1::Plan KeepPlan() {
    v1::GetPlanRequest r;
    r.set_job("keep");
    return Ok<v1::GetPlanRequest, v1::Plan>("GetPlan", r);
  }

  bool Serving() {
    auto health = grpc::health::v1::Health::NewStub(channel_);
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    grpc::health::v1::HealthCheckRequest request;
    request.set_service("muonps.v1.Coordinator");
    grpc::health::v1::HealthCheckResponse response;
    return health->Check(&context, request, &response).ok() &&
           response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }

  // Jobs the rows run against: "keep" (one worker, never touched), "boot"
  // (two workers, plan version 2, rank 0 has put NcclId('A')) and "idle"
  // (no worker, so no plan). Three jobs: the --max_jobs limit.
  void CreateJobs() {
    job_tokens_["keep"] =
        Ok<v1::CreateJobRequest, v1::Job>("CreateJob", ValidCreate("keep"))
            .job_token();
    tokens_["k0"] = Ok<v1::JoinJobRequest, v1::JoinJobResponse>(
                        "JoinJob", ValidJoin("keep", "k0", "ik0"))
                        .worker_token();
    keep_job_ = KeepJob();
    keep_plan_ = KeepPlan();
    ASSERT_EQ(keep_plan_.name(), "jobs/keep/plans/1");
    job_tokens_["boot"] =
        Ok<v1::CreateJobRequest, v1::Job>("CreateJob", ValidCreate("boot"))
            .job_token();
    tokens_["b0"] = Ok<v1::JoinJobRequest, v1::JoinJobResponse>(
                        "JoinJob", ValidJoin("boot", "b0", "ib0"))
                        .worker_token();
    tokens_["b1"] = Ok<v1::JoinJobRequest, v1::JoinJobResponse>(
                        "JoinJob", ValidJoin("boot", "b1", "ib1"))
                        .worker_token();
    v1::GetPlanRequest boot_plan;
    boot_plan.set_job("boot");
    const v1::Plan plan =
        Ok<v1::GetPlanRequest, v1::Plan>("GetPlan", boot_plan);
    ASSERT_EQ(plan.version(), 2);
    ASSERT_EQ(plan.workers_size(), 2);
    boot_rank0_ = plan.workers(0);
    boot_rank1_ = plan.workers(1);
    v1::PutNcclIdRequest put;
    put.set_job("boot");
    put.set_plan_version(2);
    put.set_worker_id(boot_rank0_);
    put.set_nccl_id(NcclId('A'));
    put.set_worker_token(tokens_.at(boot_rank0_));
    Ok<v1::PutNcclIdRequest, v1::PutNcclIdResponse>("PutNcclId", put);
    Ok<v1::CreateJobRequest, v1::Job>("CreateJob", ValidCreate("idle"));
  }

  // The table of requests (coordinator_bad_input_rows.cc).
  std::vector<Row> Rows() const;

  std::string dir_;
  std::unique_ptr<ChildProcess> coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  v1::Job keep_job_;
  v1::Plan keep_plan_;
  std::string boot_rank0_, boot_rank1_;
  std::string address_;
  // The credentials CreateJob and JoinJob handed out, by job and worker.
  std::map<std::string, std::string> job_tokens_;
  std::map<std::string, std::string> tokens_;
};

}  // namespace bad_input_test
}  // namespace muonps

#endif  // MUONPS_TESTS_COORDINATOR_BAD_INPUT_FIXTURE_H_
