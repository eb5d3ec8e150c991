// libFuzzer target: muonps.v1.Coordinator's request handling. Each input is
// a sequence of records (fuzz/fuzz_input.h); a record's tag picks an RPC
// (or a step of the clock) and its payload is parsed as that RPC's request
// and handed to a real CoordinatorService over a real Coordinator,
// fresh per input, so jobs, joins, heartbeats, plans and deletions build on
// each other as they do on a live coordinator. Any status is fine; a crash,
// a sanitizer report or a hang is a finding.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "common/metrics.h"
#include "fuzz/coordinator_rpc_tags.h"
#include "fuzz/fuzz_input.h"
#include "grpc/grpc.h"
#include "grpcpp/server_context.h"
#include "muonps/v1/coordinator.pb.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_service.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace fuzz {
namespace {

// Limits small enough that one input stays fast (the planner is linear in
// matrices and workers); the checks themselves are the production ones.
coordinator::CoordinatorOptions FuzzOptions() {
  coordinator::CoordinatorOptions options;
  options.limits.max_jobs = 8;
  options.limits.max_matrices_per_job = 512;
  options.limits.max_workers_per_job = 16;
  options.limits.max_experts = 64;
  options.limits.max_cost_table_bytes = 8 << 10;
  options.plan_history = 4;
  return options;
}

// One input: a fresh coordinator on a clock the input moves.
class CoordinatorUnderFuzz {
 public:
  CoordinatorUnderFuzz()
      : state_(FuzzOptions(), [this] { return now_; }),
        // No bearer token: the fuzzer drives the handlers behind it.
        service_(&state_, &metrics_, /*token=*/""),
        stopped_service_(&state_, &stopped_metrics_, /*token=*/"") {
    // WatchPlan on the live service would wait for a new plan (its loop
    // notices a cancelled call only every 500 ms); the stopped one checks
    // the request and returns at once.
    stopped_service_.Shutdown();
  }

  // Parses `payload` as a Request and calls `method` of the live service
  // with it, the caller's credentials filled in where the input left them
  // empty (so inputs reach what lies behind the checks; inputs that set
  // them test the checks).
  template <typename Request, typename Response, typename Method>
  void Call(Method method, const std::string& payload) {
    Request request;
    if (!request.ParseFromString(payload)) return;
    FillCredentials(&request);
    Response response;
    grpc::ServerContext context;
    const grpc::Status status =
        (service_.*method)(&context, &request, &response);
    if (status.ok()) Remember(request, response);
    TraceCall(-1, status.error_code(), status.error_message());
  }

  void Run(const FuzzRecord& record) {
    using S = coordinator::CoordinatorService;
    const std::string& p = record.payload;
    switch (static_cast<CoordinatorRpc>(record.tag % kCoordinatorRpcCount)) {
      case CoordinatorRpc::kCreateJob:
        return Call<v1::CreateJobRequest, v1::Job>(&S::CreateJob, p);
      case CoordinatorRpc::kGetJob:
        return Call<v1::GetJobRequest, v1::Job>(&S::GetJob, p);
      case CoordinatorRpc::kListJobs:
        return Call<v1::ListJobsRequest, v1::ListJobsResponse>(&S::ListJobs, p);
      case CoordinatorRpc::kDeleteJob:
        return Call<v1::DeleteJobRequest, v1::DeleteJobResponse>(&S::DeleteJob,
                                                                 p);
      case CoordinatorRpc::kJoinJob:
        return Call<v1::JoinJobRequest, v1::JoinJobResponse>(&S::JoinJob, p);
      case CoordinatorRpc::kHeartbeat:
        return Call<v1::HeartbeatRequest, v1::HeartbeatResponse>(&S::Heartbeat,
                                                                 p);
      case CoordinatorRpc::kLeaveJob:
        return Call<v1::LeaveJobRequest, v1::LeaveJobResponse>(&S::LeaveJob, p);
      case CoordinatorRpc::kListWorkers:
        return Call<v1::ListWorkersRequest, v1::ListWorkersResponse>(
            &S::ListWorkers, p);
      case CoordinatorRpc::kGetPlan:
        return Call<v1::GetPlanRequest, v1::Plan>(&S::GetPlan, p);
      case CoordinatorRpc::kWatchPlan:
        return WatchPlan(p);
      case CoordinatorRpc::kPutNcclId:
        return Call<v1::PutNcclIdRequest, v1::PutNcclIdResponse>(&S::PutNcclId,
                                                                 p);
      case CoordinatorRpc::kGetNcclId:
        return Call<v1::GetNcclIdRequest, v1::GetNcclIdResponse>(&S::GetNcclId,
                                                                 p);
      case CoordinatorRpc::kReportStepStats:
        return Call<v1::ReportStepStatsRequest, v1::ReportStepStatsResponse>(
            &S::ReportStepStats, p);
      case CoordinatorRpc::kAdvanceClock:
        return AdvanceClock(p);
    }
  }

 private:
  // The request's checks (stopped service), then the state's answer for
  // a plan above the known version without waiting.
  void WatchPlan(const std::string& payload) {
    v1::WatchPlanRequest request;
    if (!request.ParseFromString(payload)) return;
    grpc::ServerContext context;
    (void)stopped_service_.WatchPlan(&context, &request, nullptr);
    (void)state_.plans().WaitForPlan(request.job(), request.known_version(),
                                     absl::ZeroDuration());
  }

  // Moves the clock by the payload's first byte in seconds (leases last 6)
  // and expires leases, as the lease monitor does.
  void AdvanceClock(const std::string& payload) {
    const int seconds =
        payload.empty() ? 1 : static_cast<unsigned char>(payload[0]);
    now_ += absl::Seconds(seconds);
    service_.CountLostLeases(
        static_cast<int>(state_.membership().ExpireLeases().size()));
    service_.UpdateGauges();
  }

  // The credentials CreateJob and JoinJob handed out, as their callers
  // keep them.
  template <typename Request, typename Response>
  void Remember(const Request&, const Response&) {}
  void Remember(const v1::CreateJobRequest& r, const v1::Job& job) {
    job_tokens_[r.job().name()] = job.job_token();
  }
  void Remember(const v1::JoinJobRequest& r, const v1::JoinJobResponse& out) {
    worker_tokens_[{r.job(), r.worker_id()}] = out.worker_token();
  }
  template <typename Request>
  void FillCredentials(Request*) {}
  template <typename Request>
  void FillWorkerToken(Request* r) {
    if (r->worker_token().empty()) {
      r->set_worker_token(worker_tokens_[{r->job(), r->worker_id()}]);
    }
  }
  void FillCredentials(v1::HeartbeatRequest* r) { FillWorkerToken(r); }
  void FillCredentials(v1::LeaveJobRequest* r) { FillWorkerToken(r); }
  void FillCredentials(v1::PutNcclIdRequest* r) { FillWorkerToken(r); }
  void FillCredentials(v1::GetNcclIdRequest* r) { FillWorkerToken(r); }
  void FillCredentials(v1::ReportStepStatsRequest* r) { FillWorkerToken(r); }
  void FillCredentials(v1::DeleteJobRequest* r) {
    if (r->job_token().empty()) r->set_job_token(job_tokens_[r->job()]);
  }

  std::map<std::string, std::string> job_tokens_;
  std::map<std::pair<std::string, std::string>, std::string> worker_tokens_;
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  MetricsRegistry metrics_;
  MetricsRegistry stopped_metrics_;
  coordinator::Coordinator state_;
  coordinator::CoordinatorService service_;
  coordinator::CoordinatorService stopped_service_;
};

}  // namespace
}  // namespace fuzz
}  // namespace muonps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Every job and plan logs a line; millions of inputs would drown the
  // fuzzer's own output.
  // gRPC stays initialized across inputs (else every ServerContext would
  // start and stop the library: most of an input's time).
  static const bool once = [] {
    spdlog::set_level(spdlog::level::off);
    grpc_init();
    return true;
  }();
  (void)once;
  muonps::fuzz::FuzzInput input(data, size);
  muonps::fuzz::CoordinatorUnderFuzz coordinator;
  muonps::fuzz::FuzzRecord record;
  while (input.Next(&record)) coordinator.Run(record);
  return 0;
}
