#include "server/coordinator/coordinator_service.h"

#include <chrono>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {

CoordinatorService::CoordinatorService(CoordinatorState* state,
                                       MetricsRegistry* metrics,
                                       std::string token, int max_watch_streams)
    : state_(state),
      token_(std::move(token)),
      max_watch_streams_(max_watch_streams),
      rpcs_(metrics->AddCounter("muonps_coordinator_rpcs_total",
                                "RPCs served, by method and status code.",
                                {"method", "code"})),
      rpc_seconds_(metrics->AddHistogram("muonps_coordinator_rpc_seconds",
                                         "RPC latency, by method.",
                                         {"method"})),
      jobs_(metrics->AddGauge("muonps_coordinator_jobs", "Jobs held.")),
      workers_(metrics->AddGauge("muonps_coordinator_workers",
                                 "Workers holding a lease, over all jobs.")),
      plan_versions_(
          metrics->AddCounter("muonps_coordinator_plan_versions_total",
                              "Plan versions published, over all jobs.")),
      leases_lost_(metrics->AddCounter(
          "muonps_coordinator_leases_lost_total",
          "Worker leases that expired without a heartbeat.")),
      step_seconds_(
          metrics->AddHistogram("muonps_coordinator_reported_step_seconds",
                                "Step wall times workers reported.")) {}

void CoordinatorService::UpdateGauges() {
  const StateCounts counts = state_->Counts();
  jobs_->Set(static_cast<double>(counts.jobs));
  workers_->Set(static_cast<double>(counts.workers));
  const int64_t before = published_versions_.exchange(counts.plan_versions);
  if (counts.plan_versions > before) {
    plan_versions_->Increment(
        {}, static_cast<double>(counts.plan_versions - before));
  }
}

void CoordinatorService::CountLostLeases(int n) {
  if (n > 0) leases_lost_->Increment({}, n);
}

template <typename Body>
grpc::Status CoordinatorService::Serve(grpc::ServerContext* context,
                                       const char* method, Body body) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = CheckBearerToken(*context, token_);
  if (status.ok()) {
    status = body();
  } else {
    spdlog::warn("rpc {} from {} refused: {}", method, context->peer(),
                 std::string(status.message()));
  }
  rpc_seconds_->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count(),
      {method});
  rpcs_->Increment(
      {method, std::string(absl::StatusCodeToString(status.code()))});
  if (!status.ok()) {
    spdlog::debug("rpc {} failed: {}", method, status.ToString());
  }
  UpdateGauges();
  return ToGrpc(status);
}

// For handlers whose state call returns StatusOr<T>: copy the value out.
#define MUONPS_SERVE_VALUE(context, method, call, response) \
  Serve(context, method, [&]() -> absl::Status {            \
    auto result = (call);                                   \
    if (!result.ok()) return result.status();               \
    *(response) = *std::move(result);                       \
    return absl::OkStatus();                                \
  })

grpc::Status CoordinatorService::CreateJob(grpc::ServerContext* context,
                                           const v1::CreateJobRequest* r,
                                           v1::Job* out) {
  return MUONPS_SERVE_VALUE(context, "CreateJob", state_->CreateJob(*r), out);
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* context,
                                        const v1::GetJobRequest* r,
                                        v1::Job* out) {
  return MUONPS_SERVE_VALUE(context, "GetJob", state_->GetJob(r->job()), out);
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* context,
                                          const v1::ListJobsRequest*,
                                          v1::ListJobsResponse* out) {
  return Serve(context, "ListJobs", [&] {
    *out = state_->ListJobs();
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::DeleteJob(grpc::ServerContext* context,
                                           const v1::DeleteJobRequest* r,
                                           v1::DeleteJobResponse*) {
  return Serve(context, "DeleteJob", [&] { return state_->DeleteJob(*r); });
}

grpc::Status CoordinatorService::JoinJob(grpc::ServerContext* context,
                                         const v1::JoinJobRequest* r,
                                         v1::JoinJobResponse* out) {
  return MUONPS_SERVE_VALUE(context, "JoinJob", state_->JoinJob(*r), out);
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const v1::HeartbeatRequest* r,
                                           v1::HeartbeatResponse* out) {
  return MUONPS_SERVE_VALUE(context, "Heartbeat", state_->Heartbeat(*r), out);
}

grpc::Status CoordinatorService::LeaveJob(grpc::ServerContext* context,
                                          const v1::LeaveJobRequest* r,
                                          v1::LeaveJobResponse*) {
  return Serve(context, "LeaveJob", [&] { return state_->LeaveJob(*r); });
}

grpc::Status CoordinatorService::ListWorkers(grpc::ServerContext* context,
                                             const v1::ListWorkersRequest* r,
                                             v1::ListWorkersResponse* out) {
  return MUONPS_SERVE_VALUE(context, "ListWorkers", state_->ListWorkers(*r),
                            out);
}

grpc::Status CoordinatorService::GetPlan(grpc::ServerContext* context,
                                         const v1::GetPlanRequest* r,
                                         v1::Plan* out) {
  return MUONPS_SERVE_VALUE(context, "GetPlan", state_->GetPlan(*r), out);
}

grpc::Status CoordinatorService::WatchPlan(
    grpc::ServerContext* context, const v1::WatchPlanRequest* r,
    grpc::ServerWriter<v1::Plan>* writer) {
  return Serve(context, "WatchPlan", [&]() -> absl::Status {
    if (r->known_version() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("known_version: ", r->known_version(), " < 0"));
    }
    if (watch_streams_.fetch_add(1) >= max_watch_streams_) {
      watch_streams_.fetch_sub(1);
      return absl::ResourceExhaustedError(
          absl::StrCat("WatchPlan: ", max_watch_streams_,
                       " streams are open, the coordinator's limit "
                       "(--max_watch_streams); poll GetPlan instead"));
    }
    struct Release {
      std::atomic<int>* open;
      ~Release() { open->fetch_sub(1); }
    } release{&watch_streams_};
    int64_t known = r->known_version();
    // Wake up now and then to notice a cancelled call or a shutdown.
    while (!context->IsCancelled() && !shutting_down_) {
      absl::StatusOr<std::optional<v1::Plan>> plan =
          state_->WaitForPlan(r->job(), known, absl::Milliseconds(500));
      if (!plan.ok()) return plan.status();
      if (!plan->has_value()) continue;
      known = (*plan)->version();
      if (!writer->Write(**plan)) break;  // the client went away
    }
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::PutNcclId(grpc::ServerContext* context,
                                           const v1::PutNcclIdRequest* r,
                                           v1::PutNcclIdResponse*) {
  return Serve(context, "PutNcclId", [&] { return state_->PutNcclId(*r); });
}

grpc::Status CoordinatorService::GetNcclId(grpc::ServerContext* context,
                                           const v1::GetNcclIdRequest* r,
                                           v1::GetNcclIdResponse* out) {
  return MUONPS_SERVE_VALUE(context, "GetNcclId", state_->GetNcclId(*r), out);
}

grpc::Status CoordinatorService::ReportStepStats(
    grpc::ServerContext* context, const v1::ReportStepStatsRequest* r,
    v1::ReportStepStatsResponse*) {
  return Serve(context, "ReportStepStats", [&]() -> absl::Status {
    const absl::Status status = state_->ReportStepStats(*r);
    if (status.ok()) step_seconds_->Observe(r->step_seconds());
    return status;
  });
}

#undef MUONPS_SERVE_VALUE

}  // namespace coordinator
}  // namespace muonps
