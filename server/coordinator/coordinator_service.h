// The muonps.v1.Coordinator gRPC service over CoordinatorState: the one
// place where absl::Status becomes grpc::Status, where every RPC is counted
// and timed for /metrics, and where every RPC's bearer token is checked
// before its handler runs (proto/credentials.h). Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define MUONPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <string>

#include "common/metrics.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/credentials.h"
#include "proto/grpc_status.h"
#include "server/coordinator/coordinator_state.h"

namespace muonps {
namespace coordinator {

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `state` and `metrics` must outlive the service. Every RPC must carry
  // `token` as "authorization: Bearer TOKEN" (UNAUTHENTICATED otherwise,
  // nothing changed); an empty `token` checks nothing. At most
  // `max_watch_streams` WatchPlan streams are open at once (each holds a
  // server thread); more are RESOURCE_EXHAUSTED.
  CoordinatorService(CoordinatorState* state, MetricsRegistry* metrics,
                     std::string token, int max_watch_streams = 32);

  // Ends open WatchPlan streams (for shutdown).
  void Shutdown() { shutting_down_ = true; }

  // Refreshes the state gauges (jobs, workers, plan versions).
  void UpdateGauges();
  // Counts leases lost (called by the lease monitor).
  void CountLostLeases(int n);

  grpc::Status CreateJob(grpc::ServerContext*, const v1::CreateJobRequest*,
                         v1::Job*) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest*,
                      v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsResponse*) override;
  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest*,
                         v1::DeleteJobResponse*) override;
  grpc::Status JoinJob(grpc::ServerContext*, const v1::JoinJobRequest*,
                       v1::JoinJobResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse*) override;
  grpc::Status LeaveJob(grpc::ServerContext*, const v1::LeaveJobRequest*,
                        v1::LeaveJobResponse*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse*) override;
  grpc::Status WatchPlan(grpc::ServerContext*, const v1::WatchPlanRequest*,
                         grpc::ServerWriter<v1::Plan>*) override;
  grpc::Status GetPlan(grpc::ServerContext*, const v1::GetPlanRequest*,
                       v1::Plan*) override;
  grpc::Status PutNcclId(grpc::ServerContext*, const v1::PutNcclIdRequest*,
                         v1::PutNcclIdResponse*) override;
  grpc::Status GetNcclId(grpc::ServerContext*, const v1::GetNcclIdRequest*,
                         v1::GetNcclIdResponse*) override;
  grpc::Status ReportStepStats(grpc::ServerContext*,
                               const v1::ReportStepStatsRequest*,
                               v1::ReportStepStatsResponse*) override;

 private:
  // Checks the caller's token, runs `body`, converts its status, and
  // records count and latency.
  template <typename Body>
  grpc::Status Serve(grpc::ServerContext* context, const char* method,
                     Body body);

  CoordinatorState* state_;
  const std::string token_;
  const int max_watch_streams_;
  std::atomic<int> watch_streams_{0};
  Counter* rpcs_;
  Histogram* rpc_seconds_;
  Gauge* jobs_;
  Gauge* workers_;
  Counter* plan_versions_;
  Counter* leases_lost_;
  Histogram* step_seconds_;
  std::atomic<int64_t> published_versions_{0};
  std::atomic<bool> shutting_down_{false};
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
