// muonps::Client: creation and the calls made before Start (declaring
// and lending tensors, job options), and the buffer and plan queries.
// Start is in client_start.cc, Step in client_step.cc, the saved state
// (momentum, AdamW moments, checkpoints) in client_state.cc.
#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "kernels/device_ops.h"
#include "proto/grpc_status.h"
#include "proto/translate.h"

namespace muonps {

namespace {

// A matrix's momentum (worker) or a big job's plan (coordinator) travels in
// one message: gRPC's 4 MiB default stops at 1024 x 1024 floats.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Channel(
    const std::string& target, const SecurityConfig& security) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(1 << 30);
  args.SetMaxSendMessageSize(1 << 30);
  return OpenChannel(target, security, args);
}

}  // namespace

Client::Client(const ClientOptions& options,
               std::shared_ptr<grpc::Channel> coordinator,
               std::shared_ptr<grpc::Channel> worker)
    : options_(options),
      coordinator_(v1::Coordinator::NewStub(std::move(coordinator))),
      worker_(v1::Worker::NewStub(std::move(worker))) {}

Client::~Client() {
  if (pending_.valid()) pending_.wait();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options) {
  if (options.coordinator.empty()) {
    return InvalidField("coordinator", "is empty");
  }
  if (options.job.empty()) return InvalidField("job", "is empty");
  if (options.worker_socket.empty()) {
    return InvalidField("worker_socket", "is empty");
  }
  if (options.trainer_count < 1 || options.trainer_rank < 0 ||
      options.trainer_rank >= options.trainer_count) {
    return InvalidField(
        "trainer_rank",
        absl::StrCat(options.trainer_rank, " of ", options.trainer_count,
                     " is not a valid rank"));
  }
  ClientOptions resolved = options;
  resolved.security = WithEnvironmentDefaults(options.security);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> coordinator =
      Channel(resolved.coordinator, resolved.security);
  if (!coordinator.ok()) return coordinator.status();
  absl::StatusOr<std::shared_ptr<grpc::Channel>> worker =
      Channel(absl::StrCat("unix:", resolved.worker_socket), resolved.security);
  if (!worker.ok()) return worker.status();
  return std::unique_ptr<Client>(
      new Client(resolved, *std::move(coordinator), *std::move(worker)));
}

Client::Tensor* Client::Find(const std::string& name) {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const Client::Tensor* Client::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

absl::Status Client::AddMatrix(const std::string& name, int64_t rows,
                               int64_t cols, const MatrixOptions& options) {
  const std::string field = absl::StrCat("matrix ", Quoted(name));
  if (started_)
    return FieldError(absl::StatusCode::kFailedPrecondition, field,
                      "added after Start");
  if (name.empty()) return InvalidField("name", "is empty");
  if (Find(name) != nullptr) return InvalidField(field, "is declared twice");
  if (rows < 1 || cols < 1 || options.experts < 1) {
    return InvalidField(
        field, absl::StrCat("shape [", options.experts, ", ", rows, ", ", cols,
                            "] must be positive"));
  }
  if (rows > kMaxDimension || cols > kMaxDimension ||
      options.experts > kMaxDimension ||
      rows * cols > kMaxTensorElements / options.experts) {
    return InvalidField(
        field, absl::StrCat("shape [", options.experts, ", ", rows, ", ", cols,
                            "] is larger than ", kMaxTensorElements,
                            " elements or ", kMaxDimension, " in a dimension"));
  }
  Tensor t;
  t.name = name;
  t.muon = true;
  t.rows = rows;
  t.cols = cols;
  t.matrix = options;
  t.layout = options.layout;
  int64_t local_rows = rows;
  if (options.layout == scheduler::Layout::kRowSharded) {
    const auto [begin, end] =
        TrainerRowRange(rows, options_.trainer_rank, options_.trainer_count);
    local_rows = end - begin;
    if (local_rows < 1) {
      return InvalidField(
          field, absl::StrCat(rows, " rows split over ", options_.trainer_count,
                              " trainers as torch.chunk splits them leave "
                              "none to trainer ",
                              options_.trainer_rank));
    }
  }
  t.elements = local_rows * cols * options.experts;
  t.param_elements =
      options.shard_params ? t.elements : rows * cols * options.experts;
  index_[name] = tensors_.size();
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Client::AddTensor(const std::string& name, int64_t elements,
                               scheduler::Layout layout) {
  const std::string field = absl::StrCat("tensor ", Quoted(name));
  if (started_)
    return FieldError(absl::StatusCode::kFailedPrecondition, field,
                      "added after Start");
  if (name.empty()) return InvalidField("name", "is empty");
  if (Find(name) != nullptr) return InvalidField(field, "is declared twice");
  if (elements < 1 || elements > kMaxTensorElements) {
    return InvalidField(field, absl::StrCat("elements must be in [1, ",
                                            kMaxTensorElements, "]"));
  }
  if (layout == scheduler::Layout::kRowSharded) {
    return InvalidField(field, "AdamW tensors are replicated or unreduced");
  }
  if (options_.device.is_cuda() && layout != scheduler::Layout::kUnreduced) {
    return FieldError(absl::StatusCode::kInvalidArgument, field,
                      "a CUDA trainer steps its AdamW tensors itself; lend "
                      "only unreduced ones (the workers average their "
                      "gradients)");
  }
  Tensor t;
  t.name = name;
  t.layout = layout;
  t.elements = elements;
  t.param_elements = elements;
  t.exp_avg.assign(elements, 0.0f);
  t.exp_avg_sq.assign(elements, 0.0f);
  index_[name] = tensors_.size();
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Client::ExpectDedicatedWorkers(int count) {
  if (started_) {
    return FieldError(absl::StatusCode::kFailedPrecondition,
                      "dedicated_workers", "set after Start");
  }
  if (count < 0 || count > 1024) {
    return InvalidField("dedicated_workers",
                        absl::StrCat(count, " is not in [0, 1024]"));
  }
  dedicated_workers_ = count;
  return absl::OkStatus();
}

absl::Status Client::AllowMomentumReset(bool allow) {
  if (started_) {
    return FieldError(absl::StatusCode::kFailedPrecondition,
                      "allow_momentum_reset", "set after Start");
  }
  allow_momentum_reset_ = allow;
  return absl::OkStatus();
}

absl::Status Client::LendCuda(const std::string& name, void* grad, void* param,
                              DType dtype) {
  const std::string field = absl::StrCat("matrix ", Quoted(name));
  if (started_) {
    return FieldError(absl::StatusCode::kFailedPrecondition, field,
                      "lent after Start");
  }
  if (!options_.device.is_cuda()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, field,
                      "LendCuda needs ClientOptions.device cuda:N");
  }
  Tensor* t = Find(name);
  if (t == nullptr) {
    return FieldError(absl::StatusCode::kNotFound, field, "was not declared");
  }
  if (t->cuda_grad != nullptr) return InvalidField(field, "is lent twice");
  if (grad == nullptr || param == nullptr) {
    return InvalidField(field, "grad and param must be device buffers");
  }
  if (absl::Status s = kernels::CheckLentDType(dtype); !s.ok()) {
    return Annotate(s, field);
  }
  t->cuda_grad = grad;
  t->cuda_param = param;
  t->dtype = dtype;
  return absl::OkStatus();
}

absl::StatusOr<TensorBuffers> Client::Buffers(const std::string& name) const {
  const Tensor* t = Find(name);
  if (t == nullptr) {
    return FieldError(absl::StatusCode::kNotFound, "name",
                      absl::StrCat(Quoted(name), " was not declared"));
  }
  TensorBuffers out;
  if (options_.device.is_cuda()) {
    out.grad = static_cast<float*>(t->cuda_grad);
    out.param = static_cast<float*>(t->cuda_param);
    out.dtype = t->dtype;
  } else if (!segment_.has_value()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "name",
                      "buffers exist after Start");
  } else {
    char* base = static_cast<char*>(segment_->data());
    out.grad = reinterpret_cast<float*>(base + t->offset);
    out.param = reinterpret_cast<float*>(base + t->offset + t->elements * 4);
  }
  out.elements = t->elements;
  out.param_elements = t->param_elements;
  out.row_begin = 0;
  out.row_end = t->rows;
  if (t->muon && t->matrix.layout == scheduler::Layout::kRowSharded) {
    std::tie(out.row_begin, out.row_end) =
        TrainerRowRange(t->rows, options_.trainer_rank, options_.trainer_count);
  }
  return out;
}

absl::StatusOr<std::map<std::string, kernels::NsAlgorithm>>
Client::NsAlgorithms() const {
  if (!started_) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "NsAlgorithms",
                      "called before Start");
  }
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(10)));
  v1::GetPlanRequest request;
  request.set_job(options_.job);
  v1::Plan plan;
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(coordinator_->GetPlan(&context, request, &plan), "GetPlan"));
  std::map<std::string, kernels::NsAlgorithm> out;
  for (const v1::Batch& batch : plan.batches()) {
    for (const std::string& member : batch.matrices()) {
      // Members are "name" or "name[expert]".
      const std::string name = member.substr(0, member.find('['));
      out.emplace(name, proto::NsAlgorithmFromProto(batch.algorithm()));
    }
  }
  return out;
}

}  // namespace muonps
