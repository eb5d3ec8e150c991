// The muonps.v1.Coordinator gRPC service over a Coordinator: the edge.
// Every call passes the service's RpcGate (server/rpc/rpc_gate.h: bearer
// token checked before anything runs, the one absl -> gRPC status
// conversion, each call counted and timed for /metrics), its request is
// converted into the coordinator's own types (coordinator_wire.h), the
// coordinator's answer back into the reply. Nothing below this service
// sees a muonps.v1 message. Thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define MUONPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <atomic>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/plan_reply_cache.h"
#include "server/rpc/rpc_gate.h"

namespace muonps {
namespace coordinator {

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  // `coordinator` and `metrics` must outlive the service. Every RPC must
  // carry `token` as "authorization: Bearer TOKEN" (UNAUTHENTICATED
  // otherwise, nothing changed); an empty `token` checks nothing. At most
  // `max_watch_streams` WatchPlan streams are open at once (each holds a
  // server thread); more are RESOURCE_EXHAUSTED.
  CoordinatorService(Coordinator* coordinator, MetricsRegistry* metrics,
                     std::string token, int max_watch_streams = 32);
  CoordinatorService(const CoordinatorService&) = delete;
  CoordinatorService& operator=(const CoordinatorService&) = delete;

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
  grpc::Status DrainWorker(grpc::ServerContext*, const v1::DrainWorkerRequest*,
                           v1::DrainWorkerResponse*) override;
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
  // The gate's observer: counts and times the call, refreshes the gauges.
  void Observe(absl::string_view method, const absl::Status& status,
               absl::Duration elapsed);

  Coordinator* const coordinator_;
  const int max_watch_streams_;
  std::atomic<int> watch_streams_{0};
  Counter* rpcs_;
  Histogram* rpc_seconds_;
  Gauge* jobs_;
  Gauge* workers_;
  Counter* plan_versions_;
  Counter* leases_lost_;
  Histogram* step_seconds_;
  Counter* rebalances_;
  std::atomic<int64_t> published_versions_{0};
  std::atomic<bool> shutting_down_{false};
  PlanReplyCache plan_replies_;
  const server::RpcGate gate_;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
