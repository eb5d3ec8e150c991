// The table of bad requests for every RPC that
// coordinator_bad_input_rpcs_test sends: each row one request broken in one
// place, with the gRPC code and the field its refusal must name, and the
// retries the API documents as idempotent, which must succeed.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "tests/coordinator_bad_input_fixture.h"

namespace muonps {
namespace bad_input_test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// Copies `request`, applies `edit`, and returns the wire bytes.
template <typename Request, typename Edit>
std::string Bytes(Request request, Edit edit) {
  edit(request);
  return request.SerializeAsString();
}

}  // namespace

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
  v1::DrainWorkerRequest drain;
  drain.set_job("keep");
  drain.set_worker_id("k0");
  auto d = [&](auto edit) { return Bytes(drain, edit); };
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
  stats.set_predicted_ns_seconds(0.04);
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
      {"experts split whole on a replicated matrix", "CreateJob",
       c([&](auto& r) {
         m0(r)->set_layout(v1::LAYOUT_REPLICATED);
         m0(r)->set_shard_experts(true);
       }),
       kInvalid, "job.matrices[0].shard_experts"},
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
      {"cost_table measured on another GPU model", "JoinJob", j([](auto& r) {
         r.mutable_device()->set_name("NVIDIA H200");
         r.set_cost_table(R"({"device": "NVIDIA H100 80GB HBM3"})");
       }),
       kInvalid, "cost_table: measured on \"NVIDIA H100 80GB HBM3\""},
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
      {"unknown worker", "DrainWorker",
       d([](auto& r) { r.set_worker_id("k9"); }), kNotFound, "worker_id"},
      {"space in worker_id", "DrainWorker",
       d([](auto& r) { r.set_worker_id("k 0"); }), kInvalid, "worker_id"},
      {"unknown job", "DrainWorker", d([](auto& r) { r.set_job("nope"); }),
       kNotFound, "job"},
      {"empty job", "DrainWorker", d([](auto& r) { r.set_job(""); }), kInvalid,
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
      {"negative predicted_ns_seconds", "ReportStepStats",
       s([](auto& r) { r.set_predicted_ns_seconds(-0.05); }), kInvalid,
       "predicted_ns_seconds"},
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

}  // namespace bad_input_test
}  // namespace muonps
