// The worker's local muonps.v1.Worker control service (served on a Unix
// socket for the trainer's client). Thread-safe.
#ifndef MUONPS_SERVER_WORKER_WORKER_SERVICE_H_
#define MUONPS_SERVER_WORKER_WORKER_SERVICE_H_

#include "muonps/v1/worker.grpc.pb.h"
#include "server/worker/worker_agent.h"

namespace muonps {
namespace worker {

class WorkerService final : public v1::Worker::Service {
 public:
  // `agent` must outlive the service.
  explicit WorkerService(const WorkerAgent* agent) : agent_(agent) {}

  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::WorkerStatus* out) override {
    *out = agent_->Status();
    return grpc::Status::OK;
  }

 private:
  const WorkerAgent* agent_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_WORKER_SERVICE_H_
