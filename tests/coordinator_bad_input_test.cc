// One real muonps-coordinator takes a table of bad requests for every RPC:
// each must be refused with the exact gRPC code and a message naming the
// offending field, and after each one the coordinator still serves and a
// healthy job ("keep") is byte-for-byte what it was. Rows that the API
// documents as idempotent retries must succeed and change nothing.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/credentials.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace {

using grpc::StatusCode;
using ::muonps::testing::ChildProcess;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// An ncclUniqueId-sized id: 128 bytes of `fill`.
std::string NcclId(char fill) { return std::string(128, fill); }

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::seconds(10);
}

std::string Deterministic(const google::protobuf::Message& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  return out;
}

// A valid request of each kind, which rows then break in one place.
v1::CreateJobRequest ValidCreate(const std::string& name) {
  v1::CreateJobRequest r;
  r.set_request_id(name + "-create");
  r.mutable_job()->set_name(name);
  for (const char* matrix : {"layers.0.w", "layers.1.w"}) {
    v1::Matrix* m = r.mutable_job()->add_matrices();
    m->set_name(matrix);
    m->set_rows(64);
    m->set_cols(128);
  }
  return r;
}

v1::JoinJobRequest ValidJoin(const std::string& job, const std::string& worker,
                             const std::string& instance) {
  v1::JoinJobRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id(instance);
  r.mutable_device()->set_kind("cpu");
  r.mutable_device()->set_memory_bytes(int64_t{8} << 30);
  return r;
}

// Copies `request`, applies `edit`, and returns the wire bytes.
template <typename Request, typename Edit>
std::string Bytes(Request request, Edit edit) {
  edit(request);
  return request.SerializeAsString();
}

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
    grpc::GenericStub stub(channel ? channel : channel_);
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    grpc::Slice slice(request);
    grpc::ByteBuffer request_buffer(&slice, 1);
    grpc::ByteBuffer response_buffer;
    grpc::Status status;
    absl::Notification done;
    stub.UnaryCall(&context, absl::StrCat("/", service, "/", method),
                   grpc::StubOptions(), &request_buffer, &response_buffer,
                   [&](grpc::Status s) {
                     status = std::move(s);
                     done.Notify();
                   });
    done.WaitForNotification();
    response->clear();
    std::vector<grpc::Slice> slices;
    if (status.ok() && response_buffer.Dump(&slices).ok()) {
      for (const grpc::Slice& s : slices) {
        response->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return status;
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

std::vector<Row> CoordinatorBadInputTest::Rows() const {
  constexpr StatusCode kInvalid = StatusCode::INVALID_ARGUMENT;
  constexpr StatusCode kNotFound = StatusCode::NOT_FOUND;
  constexpr StatusCode kExists = StatusCode::ALREADY_EXISTS;
  constexpr StatusCode kPrecondition = StatusCode::FAILED_PRECONDITION;
  constexpr StatusCode kExhausted = StatusCode::RESOURCE_EXHAUSTED;
  const std::string long129(129, 'x'), long257(257, 'x');

  const v1::CreateJobRequest create = ValidCreate("bad");
  auto c = [&](auto edit) { return Bytes(create, edit); };
  auto m0 = [](v1::CreateJobRequest& r) {
    return r.mutable_job()->mutable_matrices(0);
  };
  auto muon = [](v1::CreateJobRequest& r) {
    return r.mutable_job()->mutable_muon();
  };
  auto adamw = [](v1::CreateJobRequest& r) {
    return r.mutable_job()->mutable_adamw();
  };
  const v1::JoinJobRequest join = ValidJoin("keep", "k1", "ik1");
  auto j = [&](auto edit) { return Bytes(join, edit); };
  v1::HeartbeatRequest beat;
  beat.set_job("keep");
  beat.set_worker_id("k0");
  beat.set_instance_id("ik0");
  beat.set_plan_version(1);
  beat.set_worker_token(tokens_.at("k0"));
  auto h = [&](auto edit) { return Bytes(beat, edit); };
  v1::LeaveJobRequest leave;
  leave.set_job("keep");
  leave.set_worker_id("k0");
  leave.set_instance_id("ik0");
  leave.set_worker_token(tokens_.at("k0"));
  auto l = [&](auto edit) { return Bytes(leave, edit); };
  auto job = [](auto request, const std::string& name) {
    request.set_job(name);
    return request.SerializeAsString();
  };
  v1::GetPlanRequest plan;
  plan.set_job("keep");
  auto gp = [&](auto edit) { return Bytes(plan, edit); };
  v1::WatchPlanRequest watch;
  watch.set_job("keep");
  v1::PutNcclIdRequest put;
  put.set_job("boot");
  put.set_plan_version(2);
  put.set_worker_id(boot_rank0_);
  put.set_nccl_id(NcclId('A'));
  put.set_worker_token(tokens_.at(boot_rank0_));
  auto p = [&](auto edit) { return Bytes(put, edit); };
  v1::GetNcclIdRequest get;
  get.set_job("boot");
  get.set_plan_version(2);
  get.set_worker_id(boot_rank1_);
  get.set_worker_token(tokens_.at(boot_rank1_));
  auto g = [&](auto edit) { return Bytes(get, edit); };
  v1::ReportStepStatsRequest stats;
  stats.set_job("keep");
  stats.set_worker_id("k0");
  stats.set_step(1);
  stats.set_plan_version(1);
  stats.set_step_seconds(0.1);
  stats.set_ns_seconds(0.05);
  stats.set_bytes_moved(100);
  stats.set_worker_token(tokens_.at("k0"));
  auto s = [&](auto edit) { return Bytes(stats, edit); };
  // A cost table just over 2 MB, each line valid.
  std::string big_table;
  for (int batch = 1; big_table.size() < (size_t{2} << 20); ++batch) {
    absl::StrAppend(&big_table, R"({"rows": 64, "cols": 128, "batch": )", batch,
                    R"(, "algorithm": "ns5", "seconds": 0.001})", "\n");
  }
  const v1::Job keep = keep_job_;

  return {
      // CreateJob: names, limits, shapes, enums, hyperparameters.
      {"empty name", "CreateJob",
       c([](auto& r) { r.mutable_job()->set_name(""); }), kInvalid, "job.name"},
      {"slash in name", "CreateJob",
       c([](auto& r) { r.mutable_job()->set_name("a/b"); }), kInvalid,
       "job.name"},
      {"space in name", "CreateJob",
       c([](auto& r) { r.mutable_job()->set_name("a b"); }), kInvalid,
       "job.name"},
      {"non-ASCII name", "CreateJob", c([](auto& r) {
         r.mutable_job()->set_name(
             "j\xc3\xb6"
             "b");
       }),
       kInvalid, "job.name"},
      {"129-byte name", "CreateJob",
       c([&](auto& r) { r.mutable_job()->set_name(long129); }), kInvalid,
       "job.name"},
      {"65-byte request_id", "CreateJob",
       c([](auto& r) { r.set_request_id(std::string(65, 'r')); }), kInvalid,
       "request_id"},
      {"no matrices", "CreateJob",
       c([](auto& r) { r.mutable_job()->clear_matrices(); }), kInvalid,
       "job.matrices"},
      {"11 matrices over --max_matrices_per_job 10", "CreateJob",
       c([](auto& r) {
         for (int i = 2; i < 11; ++i) {
           *r.mutable_job()->add_matrices() = r.job().matrices(0);
           r.mutable_job()->mutable_matrices(i)->set_name(absl::StrCat("m", i));
         }
       }),
       kExhausted, "job.matrices"},
      {"empty matrix name", "CreateJob",
       c([&](auto& r) { m0(r)->set_name(""); }), kInvalid,
       "job.matrices[0].name"},
      {"257-byte matrix name", "CreateJob",
       c([&](auto& r) { m0(r)->set_name(long257); }), kInvalid,
       "job.matrices[0].name"},
      {"control character in matrix name", "CreateJob",
       c([&](auto& r) { m0(r)->set_name("a\nb"); }), kInvalid,
       "job.matrices[0].name"},
      {"duplicate matrix names", "CreateJob",
       c([&](auto& r) { m0(r)->set_name(r.job().matrices(1).name()); }),
       kInvalid, "job.matrices[1].name"},
      {"zero rows", "CreateJob", c([&](auto& r) { m0(r)->set_rows(0); }),
       kInvalid, "job.matrices[0].rows"},
      {"negative rows", "CreateJob", c([&](auto& r) { m0(r)->set_rows(-64); }),
       kInvalid, "job.matrices[0].rows"},
      {"zero cols", "CreateJob", c([&](auto& r) { m0(r)->set_cols(0); }),
       kInvalid, "job.matrices[0].cols"},
      {"negative cols", "CreateJob", c([&](auto& r) { m0(r)->set_cols(-1); }),
       kInvalid, "job.matrices[0].cols"},
      {"rows over --max_dim", "CreateJob",
       c([&](auto& r) { m0(r)->set_rows((int64_t{1} << 20) + 1); }), kInvalid,
       "job.matrices[0].rows"},
      {"cols INT64_MAX", "CreateJob", c([&](auto& r) {
         m0(r)->set_cols(std::numeric_limits<int64_t>::max());
       }),
       kInvalid, "job.matrices[0].cols"},
      {"negative experts", "CreateJob",
       c([&](auto& r) { m0(r)->set_experts(-1); }), kInvalid,
       "job.matrices[0].experts"},
      {"experts over --max_experts", "CreateJob",
       c([&](auto& r) { m0(r)->set_experts(65537); }), kInvalid,
       "job.matrices[0].experts"},
      {"negative layer", "CreateJob", c([&](auto& r) { m0(r)->set_layer(-1); }),
       kInvalid, "job.matrices[0].layer"},
      {"unknown dtype 99", "CreateJob",
       c([&](auto& r) { m0(r)->set_dtype(static_cast<v1::DType>(99)); }),
       kInvalid, "job.matrices[0].dtype"},
      {"unknown dtype -1 on the second matrix", "CreateJob", c([](auto& r) {
         r.mutable_job()->mutable_matrices(1)->set_dtype(
             static_cast<v1::DType>(-1));
       }),
       kInvalid, "job.matrices[1].dtype"},
      {"unknown layout 42", "CreateJob",
       c([&](auto& r) { m0(r)->set_layout(static_cast<v1::Layout>(42)); }),
       kInvalid, "job.matrices[0].layout"},
      {"unknown adjust_lr_fn 7", "CreateJob", c([&](auto& r) {
         muon(r)->set_adjust_lr_fn(static_cast<v1::LrAdjustment>(7));
       }),
       kInvalid, "job.muon.adjust_lr_fn"},
      {"unknown ns_algorithm -3", "CreateJob", c([&](auto& r) {
         muon(r)->set_ns_algorithm(static_cast<v1::NsAlgorithm>(-3));
       }),
       kInvalid, "job.muon.ns_algorithm"},
      {"NaN lr", "CreateJob", c([&](auto& r) { muon(r)->set_lr(kNaN); }),
       kInvalid, "job.muon.lr"},
      {"negative lr", "CreateJob", c([&](auto& r) { muon(r)->set_lr(-0.02); }),
       kInvalid, "job.muon.lr"},
      {"infinite lr", "CreateJob", c([&](auto& r) { muon(r)->set_lr(kInf); }),
       kInvalid, "job.muon.lr"},
      {"negative weight_decay", "CreateJob",
       c([&](auto& r) { muon(r)->set_weight_decay(-0.1); }), kInvalid,
       "job.muon.weight_decay"},
      {"momentum 1.0", "CreateJob",
       c([&](auto& r) { muon(r)->set_momentum(1.0); }), kInvalid,
       "job.muon.momentum"},
      {"negative momentum", "CreateJob",
       c([&](auto& r) { muon(r)->set_momentum(-0.5); }), kInvalid,
       "job.muon.momentum"},
      {"NaN momentum", "CreateJob",
       c([&](auto& r) { muon(r)->set_momentum(kNaN); }), kInvalid,
       "job.muon.momentum"},
      {"negative ns_steps", "CreateJob",
       c([&](auto& r) { muon(r)->set_ns_steps(-1); }), kInvalid,
       "job.muon.ns_steps"},
      {"ns_steps 101", "CreateJob",
       c([&](auto& r) { muon(r)->set_ns_steps(101); }), kInvalid,
       "job.muon.ns_steps"},
      {"NaN AdamW lr", "CreateJob", c([&](auto& r) { adamw(r)->set_lr(kNaN); }),
       kInvalid, "job.adamw.lr"},
      {"AdamW beta1 1.0", "CreateJob",
       c([&](auto& r) { adamw(r)->set_beta1(1.0); }), kInvalid,
       "job.adamw.beta1"},
      {"negative AdamW beta2", "CreateJob",
       c([&](auto& r) { adamw(r)->set_beta2(-0.1); }), kInvalid,
       "job.adamw.beta2"},
      {"negative AdamW eps", "CreateJob",
       c([&](auto& r) { adamw(r)->set_eps(-1e-8); }), kInvalid,
       "job.adamw.eps"},
      {"infinite AdamW weight_decay", "CreateJob",
       c([&](auto& r) { adamw(r)->set_weight_decay(kInf); }), kInvalid,
       "job.adamw.weight_decay"},
      {"negative bucket_bytes", "CreateJob",
       c([](auto& r) { r.mutable_job()->set_bucket_bytes(-1); }), kInvalid,
       "job.bucket_bytes"},
      {"bucket_bytes over 1 TiB", "CreateJob", c([](auto& r) {
         r.mutable_job()->set_bucket_bytes((int64_t{1} << 40) + 1);
       }),
       kInvalid, "job.bucket_bytes"},
      {"existing name, another request_id", "CreateJob",
       Bytes(ValidCreate("keep"), [](auto& r) { r.set_request_id("other"); }),
       kExists, "job.name"},
      {"existing name, no request_id", "CreateJob",
       Bytes(ValidCreate("keep"), [](auto& r) { r.clear_request_id(); }),
       kExists, "job.name"},
      {"existing name, same request_id (a retry)", "CreateJob",
       ValidCreate("keep").SerializeAsString(), StatusCode::OK, "", false,
       [keep, token = job_tokens_.at("keep")](const std::string& bytes) {
         v1::Job retried;
         ASSERT_TRUE(retried.ParseFromString(bytes));
         // A retry is answered as the create was, token included.
         EXPECT_EQ(retried.job_token(), token);
         retried.clear_job_token();
         EXPECT_EQ(Deterministic(retried), Deterministic(keep));
       }},
      {"a fourth job over --max_jobs 3", "CreateJob",
       ValidCreate("fourth").SerializeAsString(), kExhausted, "job"},

      // GetJob, ListWorkers, DeleteJob: the job name.
      {"empty job", "GetJob", job(v1::GetJobRequest(), ""), kInvalid, "job"},
      {"path in job", "GetJob", job(v1::GetJobRequest(), "../keep"), kInvalid,
       "job"},
      {"129-byte job", "GetJob", job(v1::GetJobRequest(), long129), kInvalid,
       "job"},
      {"unknown job", "GetJob", job(v1::GetJobRequest(), "nope"), kNotFound,
       "job"},
      {"slash in job", "ListWorkers", job(v1::ListWorkersRequest(), "a/b"),
       kInvalid, "job"},
      {"257-byte job", "ListWorkers", job(v1::ListWorkersRequest(), long257),
       kInvalid, "job"},
      {"unknown job", "ListWorkers", job(v1::ListWorkersRequest(), "nope"),
       kNotFound, "job"},
      {"empty job", "DeleteJob", job(v1::DeleteJobRequest(), ""), kInvalid,
       "job"},
      {"space in job", "DeleteJob", job(v1::DeleteJobRequest(), "ke ep"),
       kInvalid, "job"},
      {"129-byte job", "DeleteJob", job(v1::DeleteJobRequest(), long129),
       kInvalid, "job"},
      {"unknown job", "DeleteJob", job(v1::DeleteJobRequest(), "nope"),
       kNotFound, "job"},

      // JoinJob: ids, device, speed, cost table, leases, limits.
      {"empty job", "JoinJob", j([](auto& r) { r.set_job(""); }), kInvalid,
       "job"},
      {"unknown job", "JoinJob", j([](auto& r) { r.set_job("nope"); }),
       kNotFound, "job"},
      {"empty worker_id", "JoinJob", j([](auto& r) { r.set_worker_id(""); }),
       kInvalid, "worker_id"},
      {"slash in worker_id", "JoinJob",
       j([](auto& r) { r.set_worker_id("w/1"); }), kInvalid, "worker_id"},
      {"129-byte worker_id", "JoinJob",
       j([&](auto& r) { r.set_worker_id(long129); }), kInvalid, "worker_id"},
      {"empty instance_id", "JoinJob",
       j([](auto& r) { r.set_instance_id(""); }), kInvalid, "instance_id"},
      {"129-byte instance_id", "JoinJob",
       j([&](auto& r) { r.set_instance_id(long129); }), kInvalid,
       "instance_id"},
      {"zero memory_bytes", "JoinJob",
       j([](auto& r) { r.mutable_device()->set_memory_bytes(0); }), kInvalid,
       "device.memory_bytes"},
      {"negative memory_bytes", "JoinJob",
       j([](auto& r) { r.mutable_device()->set_memory_bytes(-1); }), kInvalid,
       "device.memory_bytes"},
      {"device kind tpu", "JoinJob",
       j([](auto& r) { r.mutable_device()->set_kind("tpu"); }), kInvalid,
       "device.kind"},
      {"empty device kind", "JoinJob",
       j([](auto& r) { r.mutable_device()->clear_kind(); }), kInvalid,
       "device.kind"},
      {"negative device index", "JoinJob",
       j([](auto& r) { r.mutable_device()->set_index(-1); }), kInvalid,
       "device.index"},
      {"NaN speed", "JoinJob", j([](auto& r) { r.set_speed(kNaN); }), kInvalid,
       "speed"},
      {"negative speed", "JoinJob", j([](auto& r) { r.set_speed(-1); }),
       kInvalid, "speed"},
      {"infinite speed", "JoinJob", j([](auto& r) { r.set_speed(kInf); }),
       kInvalid, "speed"},
      {"257-byte data_address", "JoinJob",
       j([&](auto& r) { r.set_data_address(long257); }), kInvalid,
       "data_address"},
      {"cost_table line 2 not JSON", "JoinJob", j([](auto& r) {
         r.set_cost_table(
             "{\"device\": \"cpu\"}\n{\"rows\": 64, \"cols\": 128,\n");
       }),
       kInvalid, "cost_table: line 2"},
      // The line's key is "algorithm"; "ns_algorithm" is no cost-table key.
      {"cost_table unknown algorithm", "JoinJob", j([](auto& r) {
         r.set_cost_table(R"({"rows": 64, "cols": 128, "batch": 1, )"
                          R"("algorithm": "magic", "seconds": 0.1})");
       }),
       kInvalid, "cost_table: line 1: algorithm"},
      {"cost_table negative seconds", "JoinJob", j([](auto& r) {
         r.set_cost_table(R"({"rows": 64, "cols": 128, "batch": 1, )"
                          R"("algorithm": "ns5", "seconds": -1})");
       }),
       kInvalid, "cost_table: line 1"},
      {"cost_table line measured twice", "JoinJob", j([](auto& r) {
         const std::string line = R"({"rows": 64, "cols": 128, "batch": 1, )"
                                  R"("algorithm": "ns5", "seconds": 0.1})";
         r.set_cost_table(line + "\n" + line);
       }),
       kInvalid, "cost_table: line 2"},
      {"2 MB cost_table over --max_message_bytes", "JoinJob",
       j([&](auto& r) { r.set_cost_table(big_table); }), kExhausted,
       "larger than max"},
      {"k0 from another instance while its lease lives", "JoinJob",
       Bytes(ValidJoin("keep", "k0", "intruder"), [](auto&) {}), kExists,
       "worker_id"},
      {"k0 again from its own instance (a retry)", "JoinJob",
       ValidJoin("keep", "k0", "ik0").SerializeAsString(), StatusCode::OK, "",
       false,
       [](const std::string& bytes) {
         v1::JoinJobResponse response;
         ASSERT_TRUE(response.ParseFromString(bytes));
         EXPECT_EQ(response.plan_version(), 1);
       }},
      {"third worker over --max_workers_per_job 2", "JoinJob",
       ValidJoin("boot", "b2", "ib2").SerializeAsString(), kExhausted,
       "worker_id"},

      // Heartbeat and LeaveJob: leases.
      {"another instance", "Heartbeat",
       h([](auto& r) { r.set_instance_id("intruder"); }), kPrecondition,
       "instance_id"},
      {"unknown worker", "Heartbeat", h([](auto& r) { r.set_worker_id("k9"); }),
       kNotFound, "worker_id"},
      {"empty worker_id", "Heartbeat", h([](auto& r) { r.set_worker_id(""); }),
       kInvalid, "worker_id"},
      {"unknown job", "Heartbeat", h([](auto& r) { r.set_job("nope"); }),
       kNotFound, "job"},
      {"empty job", "Heartbeat", h([](auto& r) { r.set_job(""); }), kInvalid,
       "job"},
      {"negative plan_version", "Heartbeat",
       h([](auto& r) { r.set_plan_version(-1); }), kInvalid, "plan_version"},
      // A plan this coordinator never published: the worker must join
      // again (FAILED_PRECONDITION, which workers take for a lost lease).
      {"future plan_version", "Heartbeat",
       h([](auto& r) { r.set_plan_version(999); }), kPrecondition,
       "plan_version"},
      {"another instance", "LeaveJob",
       l([](auto& r) { r.set_instance_id("intruder"); }), kPrecondition,
       "instance_id"},
      {"unknown worker", "LeaveJob", l([](auto& r) { r.set_worker_id("k9"); }),
       kNotFound, "worker_id"},
      {"space in worker_id", "LeaveJob",
       l([](auto& r) { r.set_worker_id("k 0"); }), kInvalid, "worker_id"},
      {"unknown job", "LeaveJob", l([](auto& r) { r.set_job("nope"); }),
       kNotFound, "job"},
      {"empty job", "LeaveJob", l([](auto& r) { r.set_job(""); }), kInvalid,
       "job"},

      // WatchPlan and GetPlan: jobs and versions.
      {"empty job", "WatchPlan", job(watch, ""), kInvalid, "job"},
      {"slash in job", "WatchPlan", job(watch, "a/b"), kInvalid, "job"},
      {"unknown job", "WatchPlan", job(watch, "nope"), kNotFound, "job"},
      {"negative known_version", "WatchPlan",
       Bytes(watch, [](auto& r) { r.set_known_version(-1); }), kInvalid,
       "known_version"},
      {"version 999 not yet published", "GetPlan",
       gp([](auto& r) { r.set_version(999); }), kNotFound, "version"},
      {"negative version", "GetPlan", gp([](auto& r) { r.set_version(-1); }),
       kInvalid, "version"},
      {"empty job", "GetPlan", gp([](auto& r) { r.set_job(""); }), kInvalid,
       "job"},
      {"unknown job", "GetPlan", gp([](auto& r) { r.set_job("nope"); }),
       kNotFound, "job"},
      {"job without workers has no plan", "GetPlan",
       gp([](auto& r) { r.set_job("idle"); }), kPrecondition, "job"},

      // PutNcclId and GetNcclId: the NCCL bootstrap.
      {"empty nccl_id", "PutNcclId", p([](auto& r) { r.clear_nccl_id(); }),
       kInvalid, "nccl_id"},
      {"127-byte nccl_id", "PutNcclId",
       p([](auto& r) { r.set_nccl_id(std::string(127, 'A')); }), kInvalid,
       "nccl_id"},
      {"129-byte nccl_id", "PutNcclId",
       p([](auto& r) { r.set_nccl_id(std::string(129, 'A')); }), kInvalid,
       "nccl_id"},
      {"stale plan_version 1", "PutNcclId",
       p([](auto& r) { r.set_plan_version(1); }), kPrecondition,
       "plan_version"},
      {"future plan_version 999", "PutNcclId",
       p([](auto& r) { r.set_plan_version(999); }), kPrecondition,
       "plan_version"},
      // A negative version is invalid whatever the job's state, as GetPlan
      // and Heartbeat answer; "not the current" is for real versions.
      {"negative plan_version", "PutNcclId",
       p([](auto& r) { r.set_plan_version(-1); }), kInvalid, "plan_version"},
      {"not rank 0", "PutNcclId", p([&](auto& r) {
         r.set_worker_id(boot_rank1_);
         r.set_worker_token(tokens_.at(boot_rank1_));
       }),
       kPrecondition, "worker_id"},
      {"rank 0's id with another worker's token", "PutNcclId",
       p([&](auto& r) { r.set_worker_token(tokens_.at(boot_rank1_)); }),
       StatusCode::UNAUTHENTICATED, "worker_token"},
      {"no worker_token", "PutNcclId",
       p([](auto& r) { r.clear_worker_token(); }), StatusCode::UNAUTHENTICATED,
       "worker_token"},
      {"a worker of another job", "GetNcclId", g([&](auto& r) {
         r.set_worker_id("k0");
         r.set_worker_token(tokens_.at("k0"));
       }),
       kNotFound, "worker_id"},
      {"no worker_token", "GetNcclId",
       g([](auto& r) { r.clear_worker_token(); }), StatusCode::UNAUTHENTICATED,
       "worker_token"},
      {"another job's token", "Heartbeat",
       h([&](auto& r) { r.set_worker_token(tokens_.at("b0")); }),
       StatusCode::UNAUTHENTICATED, "worker_token"},
      {"no worker_token", "LeaveJob",
       l([](auto& r) { r.clear_worker_token(); }), StatusCode::UNAUTHENTICATED,
       "worker_token"},
      {"no worker_token", "ReportStepStats",
       s([](auto& r) { r.clear_worker_token(); }), StatusCode::UNAUTHENTICATED,
       "worker_token"},
      {"no job_token", "DeleteJob", job(v1::DeleteJobRequest(), "keep"),
       StatusCode::UNAUTHENTICATED, "job_token"},
      {"another job's token", "DeleteJob",
       [&] {
         v1::DeleteJobRequest r;
         r.set_job("keep");
         r.set_job_token(job_tokens_.at("boot"));
         return r.SerializeAsString();
       }(),
       StatusCode::UNAUTHENTICATED, "job_token"},
      // Every other RPC checks ids before state: "" is no worker at all.
      {"empty worker_id", "PutNcclId", p([](auto& r) { r.clear_worker_id(); }),
       kInvalid, "worker_id"},
      {"a different id after one was put", "PutNcclId",
       p([](auto& r) { r.set_nccl_id(NcclId('B')); }), kExists, "nccl_id"},
      {"the same id again", "PutNcclId", p([](auto&) {}), StatusCode::OK, ""},
      {"unknown job", "PutNcclId", p([](auto& r) { r.set_job("nope"); }),
       kNotFound, "job"},
      {"empty job", "PutNcclId", p([](auto& r) { r.set_job(""); }), kInvalid,
       "job"},
      // Membership is checked before the plan: b0 is no worker of "idle".
      {"a worker of another job", "PutNcclId", p([](auto& r) {
         r.set_job("idle");
         r.set_plan_version(1);
       }),
       kNotFound, "worker_id"},
      {"before rank 0 put it", "GetNcclId", g([&](auto& r) {
         r.set_job("keep");
         r.set_plan_version(1);
         r.set_worker_id("k0");
         r.set_worker_token(tokens_.at("k0"));
       }),
       kNotFound, "nccl_id"},
      {"stale plan_version 1", "GetNcclId",
       g([](auto& r) { r.set_plan_version(1); }), kPrecondition,
       "plan_version"},
      {"negative plan_version", "GetNcclId",
       g([](auto& r) { r.set_plan_version(-1); }), kInvalid, "plan_version"},
      {"unknown job", "GetNcclId", g([](auto& r) { r.set_job("nope"); }),
       kNotFound, "job"},
      {"empty job", "GetNcclId", g([](auto& r) { r.set_job(""); }), kInvalid,
       "job"},
      {"the id rank 0 put", "GetNcclId", g([](auto&) {}), StatusCode::OK, "",
       false,
       [](const std::string& bytes) {
         v1::GetNcclIdResponse response;
         ASSERT_TRUE(response.ParseFromString(bytes));
         EXPECT_EQ(response.nccl_id(), NcclId('A'));
       }},

      // ReportStepStats: numbers and membership.
      {"negative step", "ReportStepStats", s([](auto& r) { r.set_step(-1); }),
       kInvalid, "step"},
      {"NaN step_seconds", "ReportStepStats",
       s([](auto& r) { r.set_step_seconds(kNaN); }), kInvalid, "step_seconds"},
      {"negative step_seconds", "ReportStepStats",
       s([](auto& r) { r.set_step_seconds(-0.1); }), kInvalid, "step_seconds"},
      {"infinite ns_seconds", "ReportStepStats",
       s([](auto& r) { r.set_ns_seconds(kInf); }), kInvalid, "ns_seconds"},
      {"negative bytes_moved", "ReportStepStats",
       s([](auto& r) { r.set_bytes_moved(-1); }), kInvalid, "bytes_moved"},
      {"empty worker_id", "ReportStepStats",
       s([](auto& r) { r.set_worker_id(""); }), kInvalid, "worker_id"},
      {"unknown worker", "ReportStepStats",
       s([](auto& r) { r.set_worker_id("k9"); }), kNotFound, "worker_id"},
      {"unknown job", "ReportStepStats", s([](auto& r) { r.set_job("nope"); }),
       kNotFound, "job"},
      // Heartbeat refuses these versions; statistics of a version that
      // cannot exist would mislead re-planning.
      {"negative plan_version", "ReportStepStats",
       s([](auto& r) { r.set_plan_version(-1); }), kInvalid, "plan_version"},
      {"future plan_version", "ReportStepStats",
       s([](auto& r) { r.set_plan_version(999); }), kInvalid, "plan_version"},

      // Bytes that are no request at all.
      {"truncated length-delimited field", "CreateJob",
       std::string("\x12\x40\x0a\x02", 4), StatusCode::INTERNAL, "", true},
      {"wire type 7", "GetJob", std::string("\x0f\x01\x02", 3),
       StatusCode::INTERNAL, "", true},
      {"invalid UTF-8 in a string field", "GetJob",
       std::string("\x0a\x02\xff\xfe", 4), StatusCode::INTERNAL, "", true},
      {"random bytes", "JoinJob", std::string("\xde\xad\xbe\xef\xff\xff", 6),
       StatusCode::INTERNAL, "", true},
      {"random bytes", "ListJobs", std::string("\x0a\xff\xff\xff\xff", 5),
       StatusCode::INTERNAL, "", true},
      {"no such method", "NoSuchMethod", "", StatusCode::UNIMPLEMENTED, ""},
  };
}

TEST_F(CoordinatorBadInputTest,
       EveryRpcRefusesBadInputNamingTheFieldAndLeavesHealthyJobUntouched) {
  ASSERT_NO_FATAL_FAILURE(CreateJobs());
  const std::string job_before = Deterministic(keep_job_);
  const std::string plan_before = Deterministic(keep_plan_);
  const std::vector<Row> rows = Rows();
  EXPECT_GE(rows.size(), 60u);
  auto name = [](StatusCode code) {
    return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat(row.method, ": ", row.what));
    std::string response;
    int plans = 0;
    const grpc::Status status = row.method == "WatchPlan"
                                    ? Watch(row.request, &plans)
                                    : Call(row.method, row.request, &response);
    const StatusCode code = status.error_code();
    const bool code_right = row.malformed
                                ? code == StatusCode::INTERNAL ||
                                      code == StatusCode::INVALID_ARGUMENT
                                : code == row.code;
    const bool names_field =
        status.error_message().find(row.needle) != std::string::npos;
    EXPECT_TRUE(code_right && names_field)
        << "expected " << name(row.code) << " naming \"" << row.needle
        << "\"; got " << name(code) << ": " << status.error_message();
    EXPECT_EQ(plans, 0);
    if (status.ok() && row.check_response) row.check_response(response);
    ASSERT_TRUE(coordinator_->running()) << "the coordinator died; log:\n"
                                         << coordinator_->Log();
    ASSERT_TRUE(Serving());
    EXPECT_EQ(Deterministic(KeepJob()), job_before) << "job keep changed";
    EXPECT_EQ(Deterministic(KeepPlan()), plan_before) << "plan changed";
  }
  // No refused request left a job behind, and the retries added nothing.
  const auto jobs = Ok<v1::ListJobsRequest, v1::ListJobsResponse>(
      "ListJobs", v1::ListJobsRequest());
  std::vector<std::string> names;
  for (const v1::JobSummary& summary : jobs.jobs()) {
    names.push_back(summary.name());
  }
  EXPECT_EQ(names, (std::vector<std::string>{"boot", "idle", "keep"}));
}

// Every method of every service but health refuses a caller without the
// bearer token, or with a wrong one, before its handler runs: the methods
// come from the service descriptors, so a method added later is covered.
TEST_F(CoordinatorBadInputTest,
       EveryMethodButHealthRefusesCallersWithoutTheToken) {
  CreateJobs();
  const v1::Job job_before = KeepJob();
  const std::string wrong_token = testing::NewTempDir("wrong-token") + "/token";
  std::ofstream(wrong_token) << "ffffffffffffffffffffffffffffffff\n";
  const std::string ca = testing::TestCredential("ca.pem");
  for (const std::string& token_file : {std::string(), wrong_token}) {
    auto channel =
        OpenChannel(address_, {.token_file = token_file, .tls_ca_file = ca});
    ASSERT_TRUE(channel.ok());
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            "muonps.v1.Coordinator");
    ASSERT_NE(service, nullptr);
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor* method = service->method(i);
      std::string response;
      // A real request, so that only the token can be wrong.
      v1::DeleteJobRequest valid_delete;
      valid_delete.set_job("keep");
      valid_delete.set_job_token(job_tokens_.at("keep"));
      const std::string request = method->name() == "DeleteJob"
                                      ? valid_delete.SerializeAsString()
                                      : std::string();
      grpc::Status status;
      if (method->server_streaming()) {
        v1::WatchPlanRequest watch;
        watch.set_job("keep");
        grpc::ClientContext context;
        context.set_deadline(Deadline());
        auto reader =
            v1::Coordinator::NewStub(*channel)->WatchPlan(&context, watch);
        v1::Plan plan;
        EXPECT_FALSE(reader->Read(&plan));
        status = reader->Finish();
      } else {
        status = Call(method->name(), request, &response,
                      "muonps.v1.Coordinator", *channel);
      }
      EXPECT_EQ(status.error_code(), StatusCode::UNAUTHENTICATED)
          << method->name() << " with token file \"" << token_file
          << "\": " << status.error_message();
      EXPECT_EQ(status.error_message().find("ffff"), std::string::npos)
          << "a refusal must not echo the token";
    }
    // Reflection is behind the token too; health is not.
    std::string response;
    auto reflection =
        grpc::reflection::v1alpha::ServerReflection::NewStub(*channel);
    grpc::ClientContext context;
    context.set_deadline(Deadline());
    auto stream = reflection->ServerReflectionInfo(&context);
    grpc::reflection::v1alpha::ServerReflectionRequest list;
    list.set_list_services("");
    stream->Write(list);
    stream->WritesDone();
    grpc::reflection::v1alpha::ServerReflectionResponse listed;
    EXPECT_FALSE(stream->Read(&listed));
    EXPECT_EQ(stream->Finish().error_code(), StatusCode::UNAUTHENTICATED);
    auto health = grpc::health::v1::Health::NewStub(*channel);
    grpc::ClientContext health_context;
    health_context.set_deadline(Deadline());
    grpc::health::v1::HealthCheckResponse serving;
    EXPECT_TRUE(health->Check(&health_context, {}, &serving).ok());
  }
  // Plaintext against the TLS port never reaches a handler.
  auto plaintext =
      OpenChannel(address_, {.token_file = testing::TestCredential("token")});
  ASSERT_TRUE(plaintext.ok());
  std::string response;
  EXPECT_EQ(Call("ListJobs", "", &response, "muonps.v1.Coordinator", *plaintext)
                .error_code(),
            StatusCode::UNAVAILABLE);
  EXPECT_EQ(Deterministic(KeepJob()), Deterministic(job_before));
}

}  // namespace
}  // namespace muonps
