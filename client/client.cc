#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cuda_lending.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "common/trainer_segment.h"
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

absl::Status Client::EnsureJob(
    const kernels::MuonHyperparameters& muon,
    const kernels::AdamWHyperparameters& adamw,
    std::optional<kernels::NsAlgorithm> ns_algorithm) {
  v1::CreateJobRequest request;
  // Every rank sends the same request id: the first creates, the others'
  // calls are retries of it.
  request.set_request_id(absl::StrCat("client:", options_.job));
  v1::JobSpec* spec = request.mutable_job();
  spec->set_name(options_.job);
  spec->set_dedicated_workers(dedicated_workers_);
  spec->set_allow_momentum_reset(allow_momentum_reset_);
  spec->set_checkpoint_dir(checkpoint_dir_);
  spec->set_checkpoint_every(checkpoint_every_);
  for (const Tensor& t : tensors_) {
    if (!t.muon) continue;
    v1::Matrix* m = spec->add_matrices();
    m->set_name(t.name);
    m->set_rows(t.rows);
    m->set_cols(t.cols);
    m->set_experts(t.matrix.experts);
    m->set_dtype(proto::DTypeToProto(t.dtype));
    m->set_layout(proto::LayoutToProto(t.matrix.layout));
    m->set_layer(t.matrix.layer);
  }
  v1::MuonHyperparameters* h = spec->mutable_muon();
  h->set_lr(muon.lr);
  h->set_weight_decay(muon.weight_decay);
  h->set_momentum(muon.momentum);
  h->set_nesterov(muon.nesterov);
  h->set_ns_steps(muon.ns.steps);
  h->set_polar_express(muon.ns.polar_express);
  h->set_ns_eps(muon.ns.eps);
  if (!muon.ns.polar_express) {
    h->add_ns_coefficients(muon.ns.coefficients.a);
    h->add_ns_coefficients(muon.ns.coefficients.b);
    h->add_ns_coefficients(muon.ns.coefficients.c);
  }
  if (ns_algorithm.has_value()) {
    h->set_ns_algorithm(*ns_algorithm == kernels::NsAlgorithm::kGram
                            ? v1::NS_ALGORITHM_GRAM
                            : v1::NS_ALGORITHM_NS5);
  }
  h->set_adjust_lr_fn(muon.lr_adjustment ==
                              kernels::LrAdjustment::kMatchRmsAdamW
                          ? v1::LR_ADJUSTMENT_MATCH_RMS_ADAMW
                          : v1::LR_ADJUSTMENT_ORIGINAL);
  v1::AdamWHyperparameters* a = spec->mutable_adamw();
  a->set_lr(adamw.lr);
  a->set_beta1(adamw.beta1);
  a->set_beta2(adamw.beta2);
  a->set_eps(adamw.eps);
  a->set_weight_decay(adamw.weight_decay);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(10)));
  v1::Job job;
  const grpc::Status status = coordinator_->CreateJob(&context, request, &job);
  if (status.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
    return FromGrpc(status, "CreateJob");
  }
  // A job of this name from another run: usable if its matrices match.
  grpc::ClientContext get_context;
  get_context.set_deadline(DeadlineIn(absl::Seconds(10)));
  v1::GetJobRequest get;
  get.set_job(options_.job);
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(coordinator_->GetJob(&get_context, get, &job), "GetJob"));
  if (job.spec().SerializeAsString() != spec->SerializeAsString()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "job",
                      absl::StrCat(Quoted(options_.job),
                                   " exists with other matrices or "
                                   "hyperparameters"));
  }
  return absl::OkStatus();
}

absl::Status Client::WaitAndAttach() {
  v1::AttachRequest attach;
  attach.set_trainer_rank(options_.trainer_rank);
  attach.set_trainer_count(options_.trainer_count);
  attach.set_trainer_pid(getpid());
  if (segment_.has_value()) {
    attach.set_segment(segment_->name());
    attach.set_segment_bytes(static_cast<int64_t>(segment_->size()));
  } else {
    attach.set_device(DeviceName(options_.device));
    if (signals_ != nullptr)
      MUONPS_RETURN_IF_ERROR(signals_->Describe(&attach));
  }
  for (const Tensor& t : tensors_) {
    v1::TensorBinding* b = attach.add_tensors();
    b->set_name(t.name);
    if (options_.device.is_cuda()) {
      const std::string field = absl::StrCat("matrix ", Quoted(t.name));
      MUONPS_ASSIGN_OR_RETURN(
          *b->mutable_grad_cuda(),
          client_internal::ExportCudaBuffer(t.cuda_grad, t.elements, t.dtype,
                                            options_.device, field + " grad"));
      MUONPS_ASSIGN_OR_RETURN(*b->mutable_param_cuda(),
                              client_internal::ExportCudaBuffer(
                                  t.cuda_param, t.param_elements, t.dtype,
                                  options_.device, field + " param"));
    }
    b->set_grad_offset(t.offset);
    b->set_param_offset(t.offset + t.elements * 4);
    b->set_elements(t.elements);
    b->set_param_elements(t.param_elements);
    b->set_dtype(proto::DTypeToProto(t.dtype));
    b->set_layout(proto::LayoutToProto(t.layout));
    b->set_muon(t.muon);
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  grpc::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(absl::Seconds(5)));
    v1::AttachResponse response;
    last = worker_->Attach(&context, attach, &response);
    // FAILED_PRECONDITION: no plan yet; UNAVAILABLE: the worker is starting.
    if (last.ok()) return absl::OkStatus();
    if (last.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
        last.error_code() != grpc::StatusCode::UNAVAILABLE) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return FromGrpc(
      last, absl::StrCat("Attach to the worker at ", options_.worker_socket));
}

absl::Status Client::Start(const kernels::MuonHyperparameters& muon,
                           const kernels::AdamWHyperparameters& adamw,
                           std::optional<kernels::NsAlgorithm> ns_algorithm) {
  if (started_)
    return FieldError(absl::StatusCode::kFailedPrecondition, "Start",
                      "called twice");
  MUONPS_RETURN_IF_ERROR(kernels::ValidateMuonHyperparameters(muon));
  MUONPS_RETURN_IF_ERROR(kernels::ValidateAdamWHyperparameters(adamw));
  if (muon.ns.gram_restarts != kernels::NewtonSchulzOptions().gram_restarts) {
    return InvalidField("muon.ns.gram_restarts",
                        "the workers restart Gram NS on their own schedule; "
                        "leave the default");
  }
  bool any_matrix = false;
  int64_t bytes = 0;
  for (Tensor& t : tensors_) {
    any_matrix = any_matrix || t.muon;
    t.offset = bytes;
    bytes += (t.elements + t.param_elements) * 4;
  }
  if (!any_matrix) return InvalidField("matrices", "none was added");
  if (options_.device.is_cuda()) {
    for (const Tensor& t : tensors_) {
      if (t.cuda_grad == nullptr) {
        return FieldError(absl::StatusCode::kFailedPrecondition,
                          absl::StrCat("matrix ", Quoted(t.name)),
                          "was not lent (LendCuda) before Start");
      }
    }
    adamw_ = adamw;
    MUONPS_ASSIGN_OR_RETURN(
        signals_, client_internal::CudaStepSignals::Create(options_.device));
    MUONPS_RETURN_IF_ERROR(EnsureJob(muon, adamw, ns_algorithm));
    MUONPS_RETURN_IF_ERROR(WaitAndAttach());
    started_ = true;
    return absl::OkStatus();
  }
  MUONPS_ASSIGN_OR_RETURN(
      SharedMemorySegment segment,
      SharedMemorySegment::Create(
          // The form the worker checks (common/trainer_segment.h).
          TrainerSegmentName(options_.job, options_.trainer_rank, getpid(),
                             std::random_device()()),
          static_cast<size_t>(bytes)));
  segment_ = std::move(segment);
  adamw_ = adamw;
  MUONPS_RETURN_IF_ERROR(EnsureJob(muon, adamw, ns_algorithm));
  MUONPS_RETURN_IF_ERROR(WaitAndAttach());
  started_ = true;
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

absl::StatusOr<StepResult> Client::Step(int64_t step_id,
                                        const StepOptions& options) {
  if (!started_) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "step_id",
                      "Step before Start");
  }
  // AdamW's part is checked before the workers apply anything: a bad
  // adamw_lr must not leave the Muon part applied and the step counted.
  if (std::isnan(options.adamw_lr)) {
    return InvalidField("adamw_lr", "is NaN");
  }
  if (options.adamw_lr >= 0) {
    kernels::AdamWHyperparameters hyper = adamw_;
    hyper.lr = options.adamw_lr;
    if (absl::Status s = kernels::ValidateAdamWHyperparameters(hyper);
        !s.ok()) {
      return InvalidField("adamw_lr", s.message());
    }
  }
  v1::StepRequest request;
  request.set_step_id(step_id);
  request.set_lr(options.lr);
  request.set_weight_decay(options.weight_decay);
  // Agreed among the trainers like lr (the workers refuse a step whose
  // trainers' AdamW lr differ).
  request.set_adamw_lr(options.adamw_lr);
  for (const ParamGroupOptions& g : options.groups) {
    v1::ParamGroup* group = request.add_groups();
    for (const std::string& m : g.matrices) group->add_matrices(m);
    group->set_lr(g.lr);
    group->set_weight_decay(g.weight_decay);
  }
  if (!options_.device.is_cuda()) return StepOnWorker(request, options);
  // A previous async step first: its failure is this call's answer.
  if (pending_.valid()) MUONPS_RETURN_IF_ERROR(pending_.get().status());
  MUONPS_RETURN_IF_ERROR(signals_->BeforeStep(options.stream, step_id));
  if (!options.async) return StepOnWorker(request, options);
  pending_ = std::async(std::launch::async, [this, request, options] {
    return StepOnWorker(request, options);
  });
  StepResult enqueued;
  enqueued.pending = true;
  return enqueued;
}

absl::StatusOr<StepResult> Client::Wait() {
  if (!pending_.valid()) return StepResult{};
  return pending_.get();
}

absl::Status Client::CallStep(const v1::StepRequest& request,
                              v1::StepResponse* response) {
  absl::Status rpc;
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(options_.timeout));
    // Named by its socket: when the worker died mid-step, gRPC's own text
    // ("Socket closed", "Connection refused") would not say which one.
    rpc = FromGrpc(
        worker_->Step(&context, request, response),
        absl::StrCat("Step on the worker at unix:", options_.worker_socket));
    // A worker that restarted has no buffers of this trainer: nothing ran.
    if (attempt > 0 || !absl::IsFailedPrecondition(rpc) ||
        !absl::StrContains(rpc.message(), kNoTrainerAttached)) {
      break;
    }
    MUONPS_RETURN_IF_ERROR(WaitAndAttach());
  }
  return rpc;
}

absl::StatusOr<StepResult> Client::StepOnWorker(const v1::StepRequest& request,
                                                const StepOptions& options) {
  v1::StepResponse response;
  const absl::Status rpc = CallStep(request, &response);
  if (!rpc.ok()) {
    // The worker may not have released the trainer's stream.
    if (signals_ != nullptr) signals_->Release(request.step_id()).IgnoreError();
    return rpc;
  }
  StepResult result;
  result.already_applied = response.already_applied();
  result.seconds = response.seconds();
  result.bytes_moved = response.bytes_moved();
  result.momentum_reset = response.momentum_reset();
  result.plan_version = response.plan_version();
  // A CUDA trainer steps its AdamW tensors itself, on its stream, after
  // the workers averaged their gradients.
  if (options_.device.is_cuda()) return result;
  // Committed (fresh, or by an earlier call whose answer was lost): the
  // workers averaged the AdamW gradients into the lent buffers when it
  // committed. Step them here, once per step id.
  if (request.step_id() <= last_adamw_step_) return result;
  kernels::AdamWHyperparameters hyper = adamw_;
  if (options.adamw_lr >= 0) hyper.lr = options.adamw_lr;
  for (Tensor& t : tensors_) {
    if (t.muon) continue;
    MUONPS_ASSIGN_OR_RETURN(const TensorBuffers b, Buffers(t.name));
    MUONPS_RETURN_IF_ERROR(
        kernels_.AdamWStep({t.name, b.param, b.grad, t.exp_avg.data(),
                            t.exp_avg_sq.data(), t.elements},
                           hyper, adamw_steps_ + 1, kHostStream));
  }
  ++adamw_steps_;
  last_adamw_step_ = request.step_id();
  result.adamw_applied = true;
  return result;
}

}  // namespace muonps
