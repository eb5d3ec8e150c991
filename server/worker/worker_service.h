// The worker's local muonps.v1.Worker control service (served on a Unix
// socket for the trainer's client): status, buffer attachment, steps and
// the owned momentum. The worker's edge: each call's message becomes the
// core's domain struct (wire.h) and the answer a message again, here and
// nowhere below. Every call goes through one RpcGate (server/rpc): the
// caller's bearer token first, then the handler, one status conversion.
// Thread-safe.
#ifndef MUONPS_SERVER_WORKER_WORKER_SERVICE_H_
#define MUONPS_SERVER_WORKER_WORKER_SERVICE_H_

#include <cstdint>
#include <string>

#include "muonps/v1/worker.grpc.pb.h"
#include "server/rpc/rpc_gate.h"
#include "server/worker/step_engine.h"
#include "server/worker/worker_agent.h"

namespace muonps {
namespace worker {

class WorkerService final : public v1::Worker::Service {
 public:
  // `agent` and `engine` must outlive the service. Every call must carry
  // `token` as "authorization: Bearer TOKEN" (UNAUTHENTICATED otherwise;
  // empty: no check).
  WorkerService(WorkerAgent* agent, StepEngine* engine, std::string token);

  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetStatusRequest* request,
                         v1::WorkerStatus* out) override;
  grpc::Status Attach(grpc::ServerContext* context,
                      const v1::AttachRequest* request,
                      v1::AttachResponse* out) override;
  // A call cancelled, or past its deadline, before the step commits aborts
  // it on every worker: nothing is applied behind the trainer's back.
  grpc::Status Step(grpc::ServerContext* context,
                    const v1::StepRequest* request,
                    v1::StepResponse* out) override;
  grpc::Status GetMomentum(grpc::ServerContext* context,
                           const v1::GetMomentumRequest* request,
                           v1::GetMomentumResponse* out) override;
  grpc::Status SetMomentum(grpc::ServerContext* context,
                           const v1::SetMomentumRequest* request,
                           v1::SetMomentumResponse* out) override;
  grpc::Status Checkpoint(grpc::ServerContext* context,
                          const v1::CheckpointRequest* request,
                          v1::CheckpointResponse* out) override;
  grpc::Status RestoreCheckpoint(grpc::ServerContext* context,
                                 const v1::RestoreCheckpointRequest* request,
                                 v1::RestoreCheckpointResponse* out) override;
  // The momentum in MomentumChunks of kMomentumChunkFloats.
  grpc::Status StreamMomentum(
      grpc::ServerContext* context, const v1::GetMomentumRequest* request,
      grpc::ServerWriter<v1::MomentumChunk>* writer) override;
  // Chunks in offset order, all of one expert; INVALID_ARGUMENT naming
  // `values` for a gap, an overflow or a short stream.
  grpc::Status LoadMomentum(grpc::ServerContext* context,
                            grpc::ServerReader<v1::MomentumChunk>* reader,
                            v1::SetMomentumResponse* out) override;

  // Floats per MomentumChunk: 1 MiB.
  static constexpr int64_t kMomentumChunkFloats = (int64_t{1} << 20) / 4;

 private:
  WorkerAgent* const agent_;
  StepEngine* const engine_;
  const server::RpcGate gate_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_WORKER_SERVICE_H_
