// The worker's local muonps.v1.Worker control service (served on a Unix
// socket for the trainer's client): status, buffer attachment and steps.
// Thread-safe.
#ifndef MUONPS_SERVER_WORKER_WORKER_SERVICE_H_
#define MUONPS_SERVER_WORKER_WORKER_SERVICE_H_

#include <string>

#include "muonps/v1/worker.grpc.pb.h"
#include "proto/grpc_status.h"
#include "server/worker/step_engine.h"
#include "server/worker/worker_agent.h"

namespace muonps {
namespace worker {

class WorkerService final : public v1::Worker::Service {
 public:
  // `agent` and `engine` must outlive the service.
  WorkerService(WorkerAgent* agent, StepEngine* engine)
      : agent_(agent), engine_(engine) {}

  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::WorkerStatus* out) override {
    *out = agent_->Status();
    return grpc::Status::OK;
  }

  grpc::Status Attach(grpc::ServerContext*, const v1::AttachRequest* request,
                      v1::AttachResponse* out) override {
    return Reply(engine_->Attach(*request), out);
  }

  grpc::Status Step(grpc::ServerContext*, const v1::StepRequest* request,
                    v1::StepResponse* out) override {
    absl::StatusOr<v1::StepResponse> step = engine_->Step(*request);
    if (step.ok() && !step->already_applied()) agent_->ReportStep(*step);
    return Reply(std::move(step), out);
  }

  grpc::Status GetMomentum(grpc::ServerContext*,
                           const v1::GetMomentumRequest* request,
                           v1::GetMomentumResponse* out) override {
    absl::StatusOr<std::vector<float>> momentum =
        engine_->Momentum(request->matrix(), request->expert());
    if (!momentum.ok()) {
      return ToGrpc(momentum.status());
    }
    out->mutable_values()->Add(momentum->begin(), momentum->end());
    return grpc::Status::OK;
  }

  grpc::Status SetMomentum(grpc::ServerContext*,
                           const v1::SetMomentumRequest* request,
                           v1::SetMomentumResponse*) override {
    const absl::Status status = engine_->SetMomentum(
        request->matrix(), request->expert(),
        std::vector<float>(request->values().begin(), request->values().end()));
    return ToGrpc(status);
  }

 private:
  template <typename T>
  static grpc::Status Reply(absl::StatusOr<T> result, T* out) {
    if (!result.ok()) {
      return ToGrpc(result.status());
    }
    *out = *std::move(result);
    return grpc::Status::OK;
  }

  WorkerAgent* agent_;
  StepEngine* engine_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_WORKER_SERVICE_H_
