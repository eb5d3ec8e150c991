// ServedCoordinator: a Coordinator called as its clients call it, through
// the real CoordinatorService (no token) with muonps.v1 messages, each
// status back as the client reads it (FromGrpc: code and message kept).
// So the coordinator's tests cover the edge's conversions too. What no RPC
// does (WaitForPlan without a stream, ExpireLeases, Counts) goes to the
// coordinator's parts directly. Tests only (testonly in BUILD);
// thread-safe as the service is.
#ifndef MUONPS_SERVER_COORDINATOR_SERVED_COORDINATOR_H_
#define MUONPS_SERVER_COORDINATOR_SERVED_COORDINATOR_H_

#include <grpc/grpc.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "muonps/v1/coordinator.pb.h"
#include "proto/grpc_status.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/record_wire.h"

namespace muonps {
namespace coordinator {
namespace coordinator_test {

class ServedCoordinator {
 public:
  // In memory.
  explicit ServedCoordinator(
      const CoordinatorOptions& options,
      Clock clock = [] { return absl::Now(); })
      : ServedCoordinator(
            std::make_unique<Coordinator>(options, std::move(clock))) {}
  explicit ServedCoordinator(std::unique_ptr<Coordinator> coordinator)
      : coordinator_(std::move(coordinator)),
        service_(coordinator_.get(), &metrics_, /*token=*/"") {
    grpc_init();  // once per object, not per ServerContext
  }
  ~ServedCoordinator() { grpc_shutdown(); }
  ServedCoordinator(const ServedCoordinator&) = delete;
  ServedCoordinator& operator=(const ServedCoordinator&) = delete;

  // Over a JobStore (Coordinator::Open).
  static absl::StatusOr<std::unique_ptr<ServedCoordinator>> Open(
      const CoordinatorOptions& options, std::unique_ptr<JobStore> store,
      Clock clock = [] { return absl::Now(); }) {
    absl::StatusOr<std::unique_ptr<Coordinator>> opened =
        Coordinator::Open(options, std::move(store), std::move(clock));
    if (!opened.ok()) return opened.status();
    return std::make_unique<ServedCoordinator>(*std::move(opened));
  }

  Coordinator& coordinator() { return *coordinator_; }

  absl::StatusOr<v1::Job> CreateJob(const v1::CreateJobRequest& r) {
    return Call<v1::Job>(&CoordinatorService::CreateJob, r);
  }
  absl::StatusOr<v1::Job> GetJob(const std::string& job) {
    v1::GetJobRequest r;
    r.set_job(job);
    return Call<v1::Job>(&CoordinatorService::GetJob, r);
  }
  v1::ListJobsResponse ListJobs() {
    absl::StatusOr<v1::ListJobsResponse> list = Call<v1::ListJobsResponse>(
        &CoordinatorService::ListJobs, v1::ListJobsRequest());
    return list.ok() ? *list : v1::ListJobsResponse();
  }
  absl::Status DeleteJob(const v1::DeleteJobRequest& r) {
    return Call<v1::DeleteJobResponse>(&CoordinatorService::DeleteJob, r)
        .status();
  }
  absl::StatusOr<v1::JoinJobResponse> JoinJob(const v1::JoinJobRequest& r) {
    return Call<v1::JoinJobResponse>(&CoordinatorService::JoinJob, r);
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(
      const v1::HeartbeatRequest& r) {
    return Call<v1::HeartbeatResponse>(&CoordinatorService::Heartbeat, r);
  }
  absl::StatusOr<v1::LeaveJobResponse> LeaveJob(const v1::LeaveJobRequest& r) {
    return Call<v1::LeaveJobResponse>(&CoordinatorService::LeaveJob, r);
  }
  absl::StatusOr<v1::DrainWorkerResponse> DrainWorker(
      const v1::DrainWorkerRequest& r) {
    return Call<v1::DrainWorkerResponse>(&CoordinatorService::DrainWorker, r);
  }
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
      const v1::ListWorkersRequest& r) {
    return Call<v1::ListWorkersResponse>(&CoordinatorService::ListWorkers, r);
  }
  absl::StatusOr<v1::Plan> GetPlan(const v1::GetPlanRequest& r) {
    return Call<v1::Plan>(&CoordinatorService::GetPlan, r);
  }
  // PlanPublisher::WaitForPlan, the plan as WatchPlan would send it;
  // nullopt on timeout.
  absl::StatusOr<std::optional<v1::Plan>> WaitForPlan(const std::string& job,
                                                      int64_t known_version,
                                                      absl::Duration timeout) {
    absl::StatusOr<std::shared_ptr<const PublishedPlan>> plan =
        coordinator_->plans().WaitForPlan(job, known_version, timeout);
    if (!plan.ok()) return plan.status();
    if (*plan == nullptr) return std::optional<v1::Plan>();
    return std::optional<v1::Plan>(PlanToProto(**plan));
  }
  absl::Status PutNcclId(const v1::PutNcclIdRequest& r) {
    return Call<v1::PutNcclIdResponse>(&CoordinatorService::PutNcclId, r)
        .status();
  }
  absl::StatusOr<v1::GetNcclIdResponse> GetNcclId(
      const v1::GetNcclIdRequest& r) {
    return Call<v1::GetNcclIdResponse>(&CoordinatorService::GetNcclId, r);
  }
  absl::Status ReportStepStats(const v1::ReportStepStatsRequest& r) {
    return Call<v1::ReportStepStatsResponse>(
               &CoordinatorService::ReportStepStats, r)
        .status();
  }
  std::vector<std::string> ExpireLeases() {
    return coordinator_->membership().ExpireLeases();
  }
  StateCounts Counts() { return coordinator_->jobs().Counts(); }

 private:
  template <typename Reply, typename Request, typename Method>
  absl::StatusOr<Reply> Call(Method method, const Request& request) {
    grpc::ServerContext context;
    Reply reply;
    const grpc::Status status = (service_.*method)(&context, &request, &reply);
    if (!status.ok()) return FromGrpc(status, "");
    return reply;
  }

  std::unique_ptr<Coordinator> coordinator_;
  MetricsRegistry metrics_;
  CoordinatorService service_;
};

}  // namespace coordinator_test
}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_SERVED_COORDINATOR_H_
