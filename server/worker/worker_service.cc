#include "server/worker/worker_service.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/wire.h"

namespace muonps {
namespace worker {

WorkerService::WorkerService(WorkerAgent* agent, StepEngine* engine,
                             std::string token)
    : agent_(agent), engine_(engine), gate_(std::move(token)) {}

grpc::Status WorkerService::GetStatus(grpc::ServerContext* context,
                                      const v1::GetStatusRequest*,
                                      v1::WorkerStatus* out) {
  return gate_.Serve(
      *context, "GetStatus", out,
      [&]() -> absl::StatusOr<v1::WorkerStatus> { return agent_->Status(); });
}

grpc::Status WorkerService::Attach(grpc::ServerContext* context,
                                   const v1::AttachRequest* request,
                                   v1::AttachResponse* out) {
  return gate_.Serve(
      *context, "Attach", out, [&]() -> absl::StatusOr<v1::AttachResponse> {
        MUONPS_ASSIGN_OR_RETURN(const AttachRequest attach,
                                AttachRequestFromProto(*request));
        MUONPS_ASSIGN_OR_RETURN(const AttachResponse attached,
                                engine_->Attach(attach));
        return AttachResponseToProto(attached);
      });
}

grpc::Status WorkerService::Step(grpc::ServerContext* context,
                                 const v1::StepRequest* request,
                                 v1::StepResponse* out) {
  return gate_.Serve(
      *context, "Step", out, [&]() -> absl::StatusOr<v1::StepResponse> {
        // No step on a plan the coordinator may no longer have (a lost
        // lease).
        MUONPS_RETURN_IF_ERROR(agent_->CheckPlanCurrent());
        MUONPS_ASSIGN_OR_RETURN(
            const StepResponse step,
            engine_->Step(StepRequestFromProto(*request),
                          [context] { return context->IsCancelled(); }));
        if (!step.already_applied) agent_->ReportStep(step);
        return StepResponseToProto(step);
      });
}

grpc::Status WorkerService::GetMomentum(grpc::ServerContext* context,
                                        const v1::GetMomentumRequest* request,
                                        v1::GetMomentumResponse* out) {
  return gate_.Serve(
      *context, "GetMomentum", out,
      [&]() -> absl::StatusOr<v1::GetMomentumResponse> {
        MUONPS_ASSIGN_OR_RETURN(
            const std::vector<float> momentum,
            engine_->Momentum(request->matrix(), request->expert()));
        v1::GetMomentumResponse reply;
        reply.mutable_values()->Add(momentum.begin(), momentum.end());
        return reply;
      });
}

grpc::Status WorkerService::SetMomentum(grpc::ServerContext* context,
                                        const v1::SetMomentumRequest* request,
                                        v1::SetMomentumResponse*) {
  return gate_.Serve(*context, "SetMomentum", [&] {
    return engine_->SetMomentum(
        request->matrix(), request->expert(),
        std::vector<float>(request->values().begin(), request->values().end()));
  });
}

grpc::Status WorkerService::Checkpoint(grpc::ServerContext* context,
                                       const v1::CheckpointRequest*,
                                       v1::CheckpointResponse* out) {
  return gate_.Serve(*context, "Checkpoint", out,
                     [&]() -> absl::StatusOr<v1::CheckpointResponse> {
                       MUONPS_ASSIGN_OR_RETURN(const int64_t last,
                                               engine_->RequestCheckpoint());
                       v1::CheckpointResponse reply;
                       reply.set_last_checkpoint_step(last);
                       return reply;
                     });
}

grpc::Status WorkerService::RestoreCheckpoint(
    grpc::ServerContext* context, const v1::RestoreCheckpointRequest* request,
    v1::RestoreCheckpointResponse* out) {
  return gate_.Serve(*context, "RestoreCheckpoint", out,
                     [&]() -> absl::StatusOr<v1::RestoreCheckpointResponse> {
                       MUONPS_ASSIGN_OR_RETURN(
                           const int64_t restored,
                           engine_->RestoreCheckpoint(request->checkpoint_dir(),
                                                      request->step()));
                       v1::RestoreCheckpointResponse reply;
                       reply.set_restored(restored);
                       return reply;
                     });
}

grpc::Status WorkerService::StreamMomentum(
    grpc::ServerContext* context, const v1::GetMomentumRequest* request,
    grpc::ServerWriter<v1::MomentumChunk>* writer) {
  return gate_.Serve(*context, "StreamMomentum", [&]() -> absl::Status {
    MUONPS_ASSIGN_OR_RETURN(
        const std::vector<float> momentum,
        engine_->Momentum(request->matrix(), request->expert()));
    const int64_t total = static_cast<int64_t>(momentum.size());
    for (int64_t at = 0; at < total; at += kMomentumChunkFloats) {
      const int64_t end = std::min(total, at + kMomentumChunkFloats);
      v1::MomentumChunk chunk;
      chunk.set_matrix(request->matrix());
      chunk.set_expert(request->expert());
      chunk.set_total_elements(total);
      chunk.set_offset(at);
      chunk.mutable_values()->Add(momentum.begin() + at,
                                  momentum.begin() + end);
      if (!writer->Write(chunk)) {
        return absl::CancelledError("the client stopped reading the momentum");
      }
    }
    return absl::OkStatus();
  });
}

grpc::Status WorkerService::LoadMomentum(
    grpc::ServerContext* context, grpc::ServerReader<v1::MomentumChunk>* reader,
    v1::SetMomentumResponse*) {
  return gate_.Serve(*context, "LoadMomentum", [&]() -> absl::Status {
    v1::MomentumChunk chunk;
    if (!reader->Read(&chunk)) {
      return InvalidField("values", "the stream held no chunk");
    }
    const std::string matrix = chunk.matrix();
    const int64_t expert = chunk.expert();
    const int64_t total = chunk.total_elements();
    // The engine checks the size against the matrix; this bound only keeps
    // a hostile total from allocating before that.
    if (total <= 0 || total > StepEngine::kMaxLentElements) {
      return InvalidField("values", absl::StrCat("total_elements ", total,
                                                 " is not in 1..2^40"));
    }
    std::vector<float> values;
    do {
      if (chunk.offset() != static_cast<int64_t>(values.size()) ||
          chunk.offset() + chunk.values_size() > total) {
        return InvalidField(
            "values", absl::StrCat("chunk at offset ", chunk.offset(), " of ",
                                   chunk.values_size(), " floats after ",
                                   values.size(), " of ", total));
      }
      values.insert(values.end(), chunk.values().begin(), chunk.values().end());
    } while (reader->Read(&chunk));
    if (static_cast<int64_t>(values.size()) != total) {
      return InvalidField(
          "values", absl::StrCat(values.size(), " floats arrived of ", total));
    }
    return engine_->SetMomentum(matrix, expert, std::move(values));
  });
}

}  // namespace worker
}  // namespace muonps
