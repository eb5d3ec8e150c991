#include "server/coordinator/coordinator_service.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/coordinator/coordinator_wire.h"
#include "server/rpc/peer_certificate.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace coordinator {
namespace {

// A worker call's domain request with the client certificate it came with:
// the worker's id is bound to it (JobMembers::Authenticate).
template <typename Request>
Request WithCertificate(Request request, const grpc::ServerContext& context) {
  request.certificate = server::PeerCertificate(context);
  return request;
}

}  // namespace

CoordinatorService::CoordinatorService(Coordinator* coordinator,
                                       MetricsRegistry* metrics,
                                       std::string token, int max_watch_streams)
    : coordinator_(coordinator),
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
                                "Step wall times workers reported.")),
      rebalances_(metrics->AddCounter(
          "muonps_coordinator_rebalances_total",
          "Re-plans asked for because a job's ranks measured unequal "
          "speeds.")),
      gate_(std::move(token),
            [this](absl::string_view method, const absl::Status& status,
                   absl::Duration elapsed) {
              Observe(method, status, elapsed);
            }) {}

void CoordinatorService::UpdateGauges() {
  const StateCounts counts = coordinator_->jobs().Counts();
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

void CoordinatorService::Observe(absl::string_view method,
                                 const absl::Status& status,
                                 absl::Duration elapsed) {
  const std::string name(method);
  rpc_seconds_->Observe(absl::ToDoubleSeconds(elapsed), {name});
  rpcs_->Increment(
      {name, std::string(absl::StatusCodeToString(status.code()))});
  if (!status.ok()) spdlog::debug("rpc {} failed: {}", name, status.ToString());
  UpdateGauges();
}

grpc::Status CoordinatorService::CreateJob(grpc::ServerContext* context,
                                           const v1::CreateJobRequest* r,
                                           v1::Job* out) {
  return gate_.Serve(*context, "CreateJob", out,
                     [&]() -> absl::StatusOr<v1::Job> {
                       MUONPS_ASSIGN_OR_RETURN(CreateJobRequest request,
                                               CreateJobRequestFromProto(*r));
                       MUONPS_ASSIGN_OR_RETURN(
                           const JobInfo job,
                           coordinator_->jobs().CreateJob(std::move(request)));
                       return JobToProto(job);
                     });
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* context,
                                        const v1::GetJobRequest* r,
                                        v1::Job* out) {
  return gate_.Serve(*context, "GetJob", out, [&]() -> absl::StatusOr<v1::Job> {
    MUONPS_ASSIGN_OR_RETURN(const JobInfo job,
                            coordinator_->jobs().GetJob(r->job()));
    return JobToProto(job);
  });
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext* context,
                                          const v1::ListJobsRequest*,
                                          v1::ListJobsResponse* out) {
  return gate_.Serve(*context, "ListJobs", out,
                     [&]() -> absl::StatusOr<v1::ListJobsResponse> {
                       return JobListToProto(coordinator_->jobs().ListJobs());
                     });
}

grpc::Status CoordinatorService::DeleteJob(grpc::ServerContext* context,
                                           const v1::DeleteJobRequest* r,
                                           v1::DeleteJobResponse*) {
  return gate_.Serve(*context, "DeleteJob", [&] {
    return coordinator_->jobs().DeleteJob(DeleteJobRequestFromProto(*r));
  });
}

grpc::Status CoordinatorService::JoinJob(grpc::ServerContext* context,
                                         const v1::JoinJobRequest* r,
                                         v1::JoinJobResponse* out) {
  return gate_.Serve(
      *context, "JoinJob", out, [&]() -> absl::StatusOr<v1::JoinJobResponse> {
        MUONPS_ASSIGN_OR_RETURN(
            const JoinGrant grant,
            coordinator_->membership().JoinJob(
                WithCertificate(JoinRequestFromProto(*r), *context)));
        return JoinGrantToProto(grant);
      });
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context,
                                           const v1::HeartbeatRequest* r,
                                           v1::HeartbeatResponse* out) {
  return gate_.Serve(*context, "Heartbeat", out,
                     [&]() -> absl::StatusOr<v1::HeartbeatResponse> {
                       MUONPS_ASSIGN_OR_RETURN(
                           const HeartbeatReply reply,
                           coordinator_->membership().Heartbeat(WithCertificate(
                               HeartbeatRequestFromProto(*r), *context)));
                       return HeartbeatReplyToProto(reply);
                     });
}

grpc::Status CoordinatorService::LeaveJob(grpc::ServerContext* context,
                                          const v1::LeaveJobRequest* r,
                                          v1::LeaveJobResponse* out) {
  return gate_.Serve(
      *context, "LeaveJob", out, [&]() -> absl::StatusOr<v1::LeaveJobResponse> {
        MUONPS_ASSIGN_OR_RETURN(
            const int64_t version,
            coordinator_->membership().LeaveJob(
                WithCertificate(LeaveRequestFromProto(*r), *context)));
        v1::LeaveJobResponse response;
        response.set_plan_version(version);
        return response;
      });
}

grpc::Status CoordinatorService::DrainWorker(grpc::ServerContext* context,
                                             const v1::DrainWorkerRequest* r,
                                             v1::DrainWorkerResponse* out) {
  return gate_.Serve(
      *context, "DrainWorker", out,
      [&]() -> absl::StatusOr<v1::DrainWorkerResponse> {
        MUONPS_ASSIGN_OR_RETURN(
            const int64_t version,
            coordinator_->membership().DrainWorker(DrainRequestFromProto(*r)));
        v1::DrainWorkerResponse response;
        response.set_plan_version(version);
        return response;
      });
}

grpc::Status CoordinatorService::ListWorkers(grpc::ServerContext* context,
                                             const v1::ListWorkersRequest* r,
                                             v1::ListWorkersResponse* out) {
  return gate_.Serve(*context, "ListWorkers", out,
                     [&]() -> absl::StatusOr<v1::ListWorkersResponse> {
                       MUONPS_ASSIGN_OR_RETURN(
                           const std::vector<WorkerView> workers,
                           coordinator_->membership().ListWorkers(r->job()));
                       return WorkerListToProto(workers);
                     });
}

grpc::Status CoordinatorService::GetPlan(grpc::ServerContext* context,
                                         const v1::GetPlanRequest* r,
                                         v1::Plan* out) {
  return gate_.Serve(
      *context, "GetPlan", out, [&]() -> absl::StatusOr<v1::Plan> {
        MUONPS_ASSIGN_OR_RETURN(
            const std::shared_ptr<const PublishedPlan> plan,
            coordinator_->plans().GetPlan(r->job(), r->version()));
        return *plan_replies_.Reply(plan);
      });
}

grpc::Status CoordinatorService::WatchPlan(
    grpc::ServerContext* context, const v1::WatchPlanRequest* r,
    grpc::ServerWriter<v1::Plan>* writer) {
  return gate_.Serve(*context, "WatchPlan", [&]() -> absl::Status {
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
      absl::StatusOr<std::shared_ptr<const PublishedPlan>> plan =
          coordinator_->plans().WaitForPlan(r->job(), known,
                                            absl::Milliseconds(500));
      if (!plan.ok()) return plan.status();
      if (*plan == nullptr) continue;
      known = (*plan)->version;
      // The shared message, not a copy: plans of big jobs are megabytes.
      if (!writer->Write(*plan_replies_.Reply(*plan))) break;  // client gone
    }
    return absl::OkStatus();
  });
}

grpc::Status CoordinatorService::PutNcclId(grpc::ServerContext* context,
                                           const v1::PutNcclIdRequest* r,
                                           v1::PutNcclIdResponse*) {
  return gate_.Serve(*context, "PutNcclId", [&] {
    return coordinator_->nccl_ids().PutNcclId(
        WithCertificate(NcclIdPutFromProto(*r), *context));
  });
}

grpc::Status CoordinatorService::GetNcclId(grpc::ServerContext* context,
                                           const v1::GetNcclIdRequest* r,
                                           v1::GetNcclIdResponse* out) {
  return gate_.Serve(*context, "GetNcclId", out,
                     [&]() -> absl::StatusOr<v1::GetNcclIdResponse> {
                       MUONPS_ASSIGN_OR_RETURN(
                           const NcclId id,
                           coordinator_->nccl_ids().GetNcclId(WithCertificate(
                               NcclIdGetFromProto(*r), *context)));
                       return NcclIdToProto(id);
                     });
}

grpc::Status CoordinatorService::ReportStepStats(
    grpc::ServerContext* context, const v1::ReportStepStatsRequest* r,
    v1::ReportStepStatsResponse*) {
  return gate_.Serve(*context, "ReportStepStats", [&]() -> absl::Status {
    MUONPS_ASSIGN_OR_RETURN(
        const bool rebalanced,
        coordinator_->step_stats().ReportStepStats(
            WithCertificate(StepReportFromProto(*r), *context)));
    step_seconds_->Observe(r->step_seconds());
    if (rebalanced) rebalances_->Increment();
    return absl::OkStatus();
  });
}

}  // namespace coordinator
}  // namespace muonps
