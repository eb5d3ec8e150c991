// Client's saved state: the momentum of the local worker's matrices and
// the AdamW moments (state_dict), and the workers' momentum checkpoints.
// The rest of Client is in client.cc, client_start.cc and client_step.cc.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/status.h"
#include "proto/grpc_status.h"

namespace muonps {

absl::Status Client::SetCheckpointing(const std::string& dir, int64_t every) {
  if (started_) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "checkpoint_dir",
                      "set after Start");
  }
  if (dir.empty() || dir[0] != '/') {
    return InvalidField("checkpoint_dir",
                        absl::StrCat(Quoted(dir), " is not an absolute path"));
  }
  if (every < 0) {
    return InvalidField("checkpoint_every", absl::StrCat(every, " < 0"));
  }
  checkpoint_dir_ = dir;
  checkpoint_every_ = every;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Client::LastCheckpointStep() const {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(10)));
  v1::WorkerStatus status;
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(worker_->GetStatus(&context, v1::GetStatusRequest(), &status),
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
      FromGrpc(worker_->RestoreCheckpoint(&context, request, &response),
               "RestoreCheckpoint"));
  return response.restored();
}

absl::StatusOr<int64_t> Client::RequestCheckpoint() {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(30)));
  v1::CheckpointRequest request;
  v1::CheckpointResponse response;
  MUONPS_RETURN_IF_ERROR(FromGrpc(
      worker_->Checkpoint(&context, request, &response), "Checkpoint"));
  return response.last_checkpoint_step();
}

absl::StatusOr<std::vector<float>> Client::OwnedMomentum(
    const std::string& name, int64_t expert) const {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(30)));
  v1::GetMomentumRequest request;
  request.set_matrix(name);
  request.set_expert(expert);
  std::unique_ptr<grpc::ClientReader<v1::MomentumChunk>> reader =
      worker_->StreamMomentum(&context, request);
  std::vector<float> out;
  v1::MomentumChunk chunk;
  while (reader->Read(&chunk)) {
    if (chunk.offset() != static_cast<int64_t>(out.size()) ||
        chunk.total_elements() > Client::kMaxTensorElements ||
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
      worker_->LoadMomentum(&context, &response);
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

absl::Status Client::RestoreAdamW(const std::string& name,
                                  const std::vector<float>& exp_avg,
                                  const std::vector<float>& exp_avg_sq) {
  Tensor* t = Find(name);
  if (t == nullptr || t->muon) {
    return FieldError(absl::StatusCode::kNotFound, "name",
                      absl::StrCat(Quoted(name), " is not an AdamW tensor"));
  }
  if (static_cast<int64_t>(exp_avg.size()) != t->elements ||
      static_cast<int64_t>(exp_avg_sq.size()) != t->elements) {
    return InvalidField(
        absl::StrCat("tensor ", Quoted(name)),
        absl::StrCat("moments must hold ", t->elements, " floats"));
  }
  t->exp_avg = exp_avg;
  t->exp_avg_sq = exp_avg_sq;
  return absl::OkStatus();
}

absl::StatusOr<std::pair<const float*, const float*>> Client::AdamWState(
    const std::string& name) const {
  const Tensor* t = Find(name);
  if (t == nullptr || t->muon) {
    return FieldError(absl::StatusCode::kNotFound, "name",
                      absl::StrCat(Quoted(name), " is not an AdamW tensor"));
  }
  return std::make_pair(t->exp_avg.data(), t->exp_avg_sq.data());
}

}  // namespace muonps
