#include "fuzz/seed_sessions.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/muonps_c.h"
#include "fuzz/c_abi_tags.h"
#include "fuzz/coordinator_rpc_tags.h"
#include "fuzz/fuzz_input.h"
#include "fuzz/worker_fixture.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/worker.pb.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/record_wire.h"

namespace muonps {
namespace fuzz {
namespace {

v1::JobSpec LayeredJob(const std::string& name) {
  v1::JobSpec job;
  job.set_name(name);
  const v1::Layout layouts[] = {v1::LAYOUT_REPLICATED, v1::LAYOUT_UNREDUCED,
                                v1::LAYOUT_ROW_SHARDED};
  for (int i = 0; i < 3; ++i) {
    v1::Matrix* m = job.add_matrices();
    m->set_name(absl::StrCat("layers.", i, ".w"));
    m->set_rows(32 + 16 * i);
    m->set_cols(32);
    m->set_layer(i);
    m->set_layout(layouts[i]);
  }
  v1::Matrix* experts = job.add_matrices();
  experts->set_name("layers.3.experts");
  experts->set_rows(16);
  experts->set_cols(8);
  experts->set_experts(4);
  experts->set_layer(3);
  job.mutable_muon()->set_lr(0.02);
  return job;
}

v1::JoinJobRequest Join(const std::string& job, const std::string& worker,
                        bool dedicated = false) {
  v1::JoinJobRequest r;
  r.set_job(job);
  r.set_worker_id(worker);
  r.set_instance_id("i-" + worker);
  r.mutable_device()->set_kind("cpu");
  r.mutable_device()->set_memory_bytes(int64_t{1} << 30);
  r.set_data_address(worker + ".local:7001");
  r.set_dedicated(dedicated);
  return r;
}

// The plan the real coordinator publishes for `job` once `workers` joined.
v1::Plan PlanFor(const v1::JobSpec& job,
                 const std::vector<std::string>& workers) {
  coordinator::Coordinator state(coordinator::CoordinatorOptions{});
  absl::StatusOr<coordinator::JobSpec> spec =
      coordinator::JobSpecFromProto(job);
  if (!spec.ok()) return v1::Plan();
  (void)state.jobs().CreateJob({.request_id = "", .job = *std::move(spec)});
  for (const std::string& w : workers) {
    (void)state.membership().JoinJob(
        coordinator::JoinRequestFromProto(Join(job.name(), w)));
  }
  absl::StatusOr<std::shared_ptr<const coordinator::PublishedPlan>> plan =
      state.plans().GetPlan(job.name(), 0);
  return plan.ok() ? coordinator::PlanToProto(**plan) : v1::Plan();
}

template <typename Tag>
void Add(Tag tag, const google::protobuf::Message& request, std::string* in) {
  AppendRecord(static_cast<uint8_t>(tag), request.SerializeAsString(), in);
}

}  // namespace

std::vector<NamedSeed> CoordinatorSeeds() {
  using R = CoordinatorRpc;
  std::vector<NamedSeed> seeds;
  const v1::JobSpec spec = LayeredJob("x");
  std::string s;
  v1::CreateJobRequest create;
  create.set_request_id("r1");
  *create.mutable_job() = spec;
  Add(R::kCreateJob, create, &s);
  Add(R::kJoinJob, Join("x", "w1"), &s);
  v1::JoinJobRequest second = Join("x", "w2");
  second.set_cost_table(
      "{\"device\": \"cpu\"}\n"
      "{\"rows\": 32, \"cols\": 32, \"algorithm\": \"ns5\", \"batch\": 1, "
      "\"seconds\": 0.5}\n");
  second.set_speed(2.0);
  Add(R::kJoinJob, second, &s);
  Add(R::kJoinJob, Join("x", "pool0", /*dedicated=*/true), &s);
  v1::HeartbeatRequest beat;
  beat.set_job("x");
  beat.set_worker_id("w1");
  beat.set_instance_id("i-w1");
  beat.set_plan_version(1);
  Add(R::kHeartbeat, beat, &s);
  v1::ListWorkersRequest list;
  list.set_job("x");
  Add(R::kListWorkers, list, &s);
  v1::GetPlanRequest get;
  get.set_job("x");
  Add(R::kGetPlan, get, &s);
  v1::WatchPlanRequest watch;
  watch.set_job("x");
  watch.set_worker_id("w1");
  Add(R::kWatchPlan, watch, &s);
  v1::PutNcclIdRequest put;
  put.set_job("x");
  put.set_plan_version(3);
  put.set_worker_id("w1");
  put.set_nccl_id(std::string(128, '\x2a'));
  put.set_generation(1);
  Add(R::kPutNcclId, put, &s);
  v1::GetNcclIdRequest get_id;
  get_id.set_job("x");
  get_id.set_plan_version(3);
  Add(R::kGetNcclId, get_id, &s);
  v1::ReportStepStatsRequest stats;
  stats.set_job("x");
  stats.set_worker_id("w1");
  stats.set_step(1);
  stats.set_plan_version(3);
  stats.set_step_seconds(0.01);
  Add(R::kReportStepStats, stats, &s);
  v1::LeaveJobRequest leave;
  leave.set_job("x");
  leave.set_worker_id("w2");
  leave.set_instance_id("i-w2");
  Add(R::kLeaveJob, leave, &s);
  AppendRecord(static_cast<uint8_t>(R::kAdvanceClock), std::string(1, '\x0a'),
               &s);
  v1::GetJobRequest get_job;
  get_job.set_job("x");
  Add(R::kGetJob, get_job, &s);
  Add(R::kListJobs, v1::ListJobsRequest(), &s);
  v1::DeleteJobRequest del;
  del.set_job("x");
  Add(R::kDeleteJob, del, &s);
  seeds.push_back({"session", s});

  std::string bad;
  v1::CreateJobRequest zero = create;
  zero.mutable_job()->mutable_matrices(0)->set_rows(0);
  Add(R::kCreateJob, zero, &bad);
  Add(R::kJoinJob, Join("missing", "w1"), &bad);
  seeds.push_back({"refused", bad});
  return seeds;
}

std::vector<NamedSeed> PlanDecoderSeeds() {
  std::vector<NamedSeed> seeds;
  const v1::JobSpec job = LayeredJob("p");
  for (int workers = 1; workers <= 3; ++workers) {
    std::vector<std::string> ids;
    for (int w = 0; w < workers; ++w) ids.push_back(absl::StrCat("w", w));
    std::string s;
    AppendRecord(0, job.SerializeAsString(), &s);
    AppendRecord(1, PlanFor(job, ids).SerializeAsString(), &s);
    seeds.push_back({absl::StrCat("plan_", workers, "_workers"), s});
  }
  return seeds;
}

std::vector<NamedSeed> WorkerSeeds() {
  using W = WorkerCall;
  const v1::JobSpec job = FuzzWorkerJob();
  std::string s;
  Add(W::kSetPlan, PlanFor(job, {kFuzzWorkerId}), &s);
  v1::AttachRequest attach;
  attach.set_trainer_rank(0);
  attach.set_trainer_count(1);
  attach.set_segment("fuzz");  // the harness opens its own
  attach.set_segment_bytes(kFuzzSegmentBytes);
  attach.set_device("cpu");
  int64_t offset = 0;
  for (const v1::Matrix& m : job.matrices()) {
    v1::TensorBinding* b = attach.add_tensors();
    const int64_t n = m.rows() * m.cols() * std::max<int64_t>(m.experts(), 1);
    b->set_name(m.name());
    b->set_muon(true);
    b->set_layout(m.layout());
    b->set_elements(n);
    b->set_grad_offset(offset);
    b->set_param_offset(offset + 4 * n);
    // w.a in parameter group 0 (1 + its index), the others in none.
    if (m.name() == "w.a") b->set_group(1);
    offset += 8 * n;
  }
  v1::TensorBinding* bias = attach.add_tensors();
  bias->set_name("bias");
  bias->set_layout(v1::LAYOUT_UNREDUCED);
  bias->set_elements(7);
  bias->set_grad_offset(offset);
  bias->set_param_offset(offset + 28);
  Add(W::kAttach, attach, &s);
  v1::StepRequest step;
  step.set_step_id(1);
  step.set_lr(0.02);
  Add(W::kStep, step, &s);
  step.set_step_id(2);
  // Group 0's values by index: w.a's lr (the others keep the step's).
  v1::GroupHyperparameters* group = step.add_groups();
  group->set_lr(0.01);
  group->set_weight_decay(-1);
  group->set_adamw_lr(-1);
  group->set_adamw_weight_decay(-1);
  Add(W::kStep, step, &s);
  Add(W::kStep, step, &s);  // a retry: already applied
  v1::GetMomentumRequest get;
  get.set_matrix("w.e");
  get.set_expert(2);
  Add(W::kGetMomentum, get, &s);
  v1::SetMomentumRequest set;
  set.set_matrix("w.a");
  for (int i = 0; i < 64; ++i) set.add_values(0.25f);
  Add(W::kSetMomentum, set, &s);
  AppendRecord(static_cast<uint8_t>(W::kReleaseTrainerIfGone), "", &s);
  AppendRecord(static_cast<uint8_t>(W::kFollowStep), "", &s);
  return {{"plan_attach_steps", s}};
}

std::vector<NamedSeed> CAbiSeeds() {
  using C = CAbiCall;
  auto call = [](C tag, const ArgWriter& args, std::string* in) {
    AppendRecord(static_cast<uint8_t>(tag), args.bytes(), in);
  };
  std::vector<NamedSeed> seeds;
  for (const char* device : {"cpu", "cuda:0"}) {
    std::string s;
    call(C::kCreate,
         ArgWriter()
             .I32(0)
             .String("localhost:1")
             .String("job")
             .String("/tmp/none.sock")
             .String(device)
             .I32(0)
             .I32(2)
             .Double(1.0),
         &s);
    call(C::kAddMatrix,
         ArgWriter()
             .I32(0)
             .String("m.a")
             .I64(16)
             .I64(8)
             .I64(1)
             .I32(MUONPS_LAYOUT_ROW_SHARDED)
             .I32(0),
         &s);
    call(C::kAddTensor,
         ArgWriter().I32(0).String("bias").I64(7).I32(MUONPS_LAYOUT_UNREDUCED),
         &s);
    call(C::kLendCuda,
         ArgWriter().I32(0).String("m.a").String("bf16").U64(4096).U64(8192),
         &s);
    call(C::kExpectDedicated, ArgWriter().I32(0).I32(1), &s);
    call(C::kSetGroup, ArgWriter().I32(0).I32(1).I32(1).String("m.a"), &s);
    call(C::kStepWith,
         ArgWriter()
             .I32(0)
             .I64(1)
             .Double(-1)
             .Double(-1)
             .Double(-1)
             .I32(2)
             .I32(0)
             // Group 0 keeps the step's values; group 1 (m.a) has its own:
             // lr, weight decay, AdamW lr and AdamW weight decay.
             .Double(-1)
             .Double(-1)
             .Double(-1)
             .Double(-1)
             .Double(0.1)
             .Double(0.0)
             .Double(1e-3)
             .Double(0.0),
         &s);
    call(C::kBuffers, ArgWriter().I32(0).String("m.a"), &s);
    call(C::kSetAdamW, ArgWriter().I32(0).String("bias").I64(7).I64(3), &s);
    call(C::kGetAdamW, ArgWriter().I32(0).String("bias").I64(7), &s);
    call(C::kRefusedBeforeWorker, ArgWriter().I32(0).String("m.a").I32(0), &s);
    call(C::kStep, ArgWriter().I32(0).I64(1), &s);
    call(C::kWait, ArgWriter().I32(0), &s);
    call(C::kDestroy, ArgWriter(), &s);
    seeds.push_back(
        {absl::StrCat("declare_", device[1] == 'p' ? "cpu" : "cuda"), s});
  }
  return seeds;
}

}  // namespace fuzz
}  // namespace muonps
