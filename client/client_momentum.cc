// The momentum the workers hold for the job's matrices: read from and
// restored to the local worker (state_dict), and the workers' momentum
// checkpoints (asked for, looked up, restored).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/client_impl.h"
#include "common/status.h"
#include "proto/grpc_status.h"

namespace muonps {

absl::StatusOr<std::vector<float>> Client::OwnedMomentum(
    const std::string& name, int64_t expert) const {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(30)));
  v1::GetMomentumRequest request;
  request.set_matrix(name);
  request.set_expert(expert);
  std::unique_ptr<grpc::ClientReader<v1::MomentumChunk>> reader =
      impl_->worker->StreamMomentum(&context, request);
  std::vector<float> out;
  v1::MomentumChunk chunk;
  while (reader->Read(&chunk)) {
    if (chunk.offset() != static_cast<int64_t>(out.size()) ||
        chunk.total_elements() > kMaxTensorElements ||
        chunk.offset() + chunk.values_size() > chunk.total_elements()) {
      context.TryCancel();
      (void)reader->Finish();
      return absl::DataLossError(
          absl::StrCat("StreamMomentum of ", Quoted(name), ": chunk at offset ",
                       chunk.offset(), " of ", chunk.total_elements(),
                       " after ", out.size(), " floats"));
    }
    if (out.empty()) out.reserve(chunk.total_elements());
    out.insert(out.end(), chunk.values().begin(), chunk.values().end());
  }
  MUONPS_RETURN_IF_ERROR(FromGrpc(reader->Finish(), "StreamMomentum"));
  if (out.empty() ||
      static_cast<int64_t>(out.size()) != chunk.total_elements()) {
    return absl::DataLossError(absl::StrCat("StreamMomentum of ", Quoted(name),
                                            " ended after ", out.size(), " of ",
                                            chunk.total_elements(), " floats"));
  }
  return out;
}

absl::Status Client::RestoreMomentum(const std::string& name, int64_t expert,
                                     const std::vector<float>& values) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(30)));
  v1::SetMomentumResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::MomentumChunk>> writer =
      impl_->worker->LoadMomentum(&context, &response);
  constexpr int64_t kChunkFloats = (int64_t{1} << 20) / 4;  // 1 MiB
  const int64_t total = static_cast<int64_t>(values.size());
  int64_t at = 0;
  do {
    const int64_t end = std::min(total, at + kChunkFloats);
    v1::MomentumChunk chunk;
    chunk.set_matrix(name);
    chunk.set_expert(expert);
    chunk.set_total_elements(total);
    chunk.set_offset(at);
    chunk.mutable_values()->Add(values.begin() + at, values.begin() + end);
    if (!writer->Write(chunk)) break;  // Finish says why
    at = end;
  } while (at < total);
  writer->WritesDone();
  return FromGrpc(writer->Finish(), "LoadMomentum");
}

absl::StatusOr<int64_t> Client::RequestCheckpoint() {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(30)));
  v1::CheckpointRequest request;
  v1::CheckpointResponse response;
  MUONPS_RETURN_IF_ERROR(FromGrpc(
      impl_->worker->Checkpoint(&context, request, &response), "Checkpoint"));
  return response.last_checkpoint_step();
}

absl::StatusOr<int64_t> Client::LastCheckpointStep() const {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(10)));
  v1::WorkerStatus status;
  MUONPS_RETURN_IF_ERROR(FromGrpc(
      impl_->worker->GetStatus(&context, v1::GetStatusRequest(), &status),
      "GetStatus"));
  return status.last_checkpoint_step();
}

absl::StatusOr<int64_t> Client::RestoreCheckpoint(const std::string& dir,
                                                  int64_t step) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(120)));
  v1::RestoreCheckpointRequest request;
  request.set_checkpoint_dir(dir);
  request.set_step(step);
  v1::RestoreCheckpointResponse response;
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(impl_->worker->RestoreCheckpoint(&context, request, &response),
               "RestoreCheckpoint"));
  return response.restored();
}

}  // namespace muonps
