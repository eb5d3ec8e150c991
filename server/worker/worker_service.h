// The worker's local muonps.v1.Worker control service (served on a Unix
// socket for the trainer's client): status, buffer attachment and steps.
// Every method first checks the caller's bearer token (proto/credentials.h).
// Thread-safe.
#ifndef MUONPS_SERVER_WORKER_WORKER_SERVICE_H_
#define MUONPS_SERVER_WORKER_WORKER_SERVICE_H_

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "proto/credentials.h"
#include "proto/grpc_status.h"
#include "server/worker/step_engine.h"
#include "server/worker/wire.h"
#include "server/worker/worker_agent.h"

namespace muonps {
namespace worker {

#define MUONPS_RETURN_IF_UNAUTHENTICATED(context)                    \
  do {                                                               \
    const absl::Status allowed = CheckBearerToken(*context, token_); \
    if (!allowed.ok()) return ToGrpc(allowed);                       \
  } while (0)

class WorkerService final : public v1::Worker::Service {
 public:
  // `agent` and `engine` must outlive the service. Every call must carry
  // `token` as "authorization: Bearer TOKEN" (UNAUTHENTICATED otherwise;
  // empty: no check).
  WorkerService(WorkerAgent* agent, StepEngine* engine, std::string token)
      : agent_(agent), engine_(engine), token_(std::move(token)) {}

  grpc::Status GetStatus(grpc::ServerContext* context,
                         const v1::GetStatusRequest*,
                         v1::WorkerStatus* out) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    *out = agent_->Status();
    return grpc::Status::OK;
  }

  grpc::Status Attach(grpc::ServerContext* context,
                      const v1::AttachRequest* request,
                      v1::AttachResponse* out) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    absl::StatusOr<AttachRequest> attach = AttachRequestFromProto(*request);
    if (!attach.ok()) return ToGrpc(attach.status());
    absl::StatusOr<AttachResponse> attached = engine_->Attach(*attach);
    if (!attached.ok()) return ToGrpc(attached.status());
    *out = AttachResponseToProto(*attached);
    return grpc::Status::OK;
  }

  grpc::Status Step(grpc::ServerContext* context,
                    const v1::StepRequest* request,
                    v1::StepResponse* out) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    // No step on a plan the coordinator may no longer have (a lost lease).
    if (const absl::Status current = agent_->CheckPlanCurrent();
        !current.ok()) {
      return ToGrpc(current);
    }
    // A call cancelled, or past its deadline, before the step commits
    // aborts it on every worker: nothing is applied behind the trainer's
    // back (a later retry runs it).
    absl::StatusOr<StepResponse> step =
        engine_->Step(StepRequestFromProto(*request),
                      [context] { return context->IsCancelled(); });
    if (!step.ok()) return ToGrpc(step.status());
    if (!step->already_applied) agent_->ReportStep(*step);
    *out = StepResponseToProto(*step);
    return grpc::Status::OK;
  }

  grpc::Status GetMomentum(grpc::ServerContext* context,
                           const v1::GetMomentumRequest* request,
                           v1::GetMomentumResponse* out) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    absl::StatusOr<std::vector<float>> momentum =
        engine_->Momentum(request->matrix(), request->expert());
    if (!momentum.ok()) {
      return ToGrpc(momentum.status());
    }
    out->mutable_values()->Add(momentum->begin(), momentum->end());
    return grpc::Status::OK;
  }

  grpc::Status SetMomentum(grpc::ServerContext* context,
                           const v1::SetMomentumRequest* request,
                           v1::SetMomentumResponse*) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    const absl::Status status = engine_->SetMomentum(
        request->matrix(), request->expert(),
        std::vector<float>(request->values().begin(), request->values().end()));
    return ToGrpc(status);
  }

  grpc::Status Checkpoint(grpc::ServerContext* context,
                          const v1::CheckpointRequest*,
                          v1::CheckpointResponse* out) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    absl::StatusOr<int64_t> last = engine_->RequestCheckpoint();
    if (!last.ok()) return ToGrpc(last.status());
    out->set_last_checkpoint_step(*last);
    return grpc::Status::OK;
  }

  grpc::Status RestoreCheckpoint(grpc::ServerContext* context,
                                 const v1::RestoreCheckpointRequest* request,
                                 v1::RestoreCheckpointResponse* out) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    absl::StatusOr<int64_t> restored =
        engine_->RestoreCheckpoint(request->checkpoint_dir(), request->step());
    if (!restored.ok()) return ToGrpc(restored.status());
    out->set_restored(*restored);
    return grpc::Status::OK;
  }

  grpc::Status StreamMomentum(
      grpc::ServerContext* context, const v1::GetMomentumRequest* request,
      grpc::ServerWriter<v1::MomentumChunk>* writer) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    absl::StatusOr<std::vector<float>> momentum =
        engine_->Momentum(request->matrix(), request->expert());
    if (!momentum.ok()) return ToGrpc(momentum.status());
    const int64_t total = static_cast<int64_t>(momentum->size());
    for (int64_t at = 0; at < total; at += kMomentumChunkFloats) {
      const int64_t end = std::min(total, at + kMomentumChunkFloats);
      v1::MomentumChunk chunk;
      chunk.set_matrix(request->matrix());
      chunk.set_expert(request->expert());
      chunk.set_total_elements(total);
      chunk.set_offset(at);
      chunk.mutable_values()->Add(momentum->begin() + at,
                                  momentum->begin() + end);
      if (!writer->Write(chunk)) {
        return grpc::Status(grpc::StatusCode::CANCELLED,
                            "the client stopped reading the momentum");
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status LoadMomentum(grpc::ServerContext* context,
                            grpc::ServerReader<v1::MomentumChunk>* reader,
                            v1::SetMomentumResponse*) override {
    MUONPS_RETURN_IF_UNAUTHENTICATED(context);
    v1::MomentumChunk chunk;
    if (!reader->Read(&chunk)) {
      return ToGrpc(InvalidField("values", "the stream held no chunk"));
    }
    const std::string matrix = chunk.matrix();
    const int64_t expert = chunk.expert();
    const int64_t total = chunk.total_elements();
    // The engine checks the size against the matrix; this bound only keeps
    // a hostile total from allocating before that.
    if (total <= 0 || total > StepEngine::kMaxLentElements) {
      return ToGrpc(InvalidField(
          "values",
          absl::StrCat("total_elements ", total, " is not in 1..2^40")));
    }
    std::vector<float> values;
    do {
      if (chunk.offset() != static_cast<int64_t>(values.size()) ||
          chunk.offset() + chunk.values_size() > total) {
        return ToGrpc(InvalidField(
            "values", absl::StrCat("chunk at offset ", chunk.offset(), " of ",
                                   chunk.values_size(), " floats after ",
                                   values.size(), " of ", total)));
      }
      values.insert(values.end(), chunk.values().begin(), chunk.values().end());
    } while (reader->Read(&chunk));
    if (static_cast<int64_t>(values.size()) != total) {
      return ToGrpc(InvalidField(
          "values", absl::StrCat(values.size(), " floats arrived of ", total)));
    }
    return ToGrpc(engine_->SetMomentum(matrix, expert, std::move(values)));
  }

  // Floats per MomentumChunk: 1 MiB.
  static constexpr int64_t kMomentumChunkFloats = (int64_t{1} << 20) / 4;

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
  const std::string token_;
};

#undef MUONPS_RETURN_IF_UNAUTHENTICATED

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_WORKER_SERVICE_H_
