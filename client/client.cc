// muonps::Client: creation, and what a trainer declares before Start (its
// tensors, their parameter groups, lent CUDA buffers and the job's
// options), then where the tensors' buffers are. Start and the plan are in
// client_attach.cc, Step in client_step.cc, the host AdamW in
// client_adamw.cc, the workers' momentum and checkpoints in
// client_momentum.cc.
#include "client/client.h"

#include <grpcpp/grpcpp.h>

#include <new>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client_impl.h"
#include "client/internal_types.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "proto/credentials.h"

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

Client::Impl::Impl(const ClientOptions& options, const Device& device,
                   std::unique_ptr<v1::Coordinator::Stub> coordinator,
                   std::unique_ptr<v1::Worker::Stub> worker)
    : options(options),
      device(device),
      coordinator(std::move(coordinator)),
      worker(std::move(worker)) {}

Client::Impl::~Impl() {
  if (pending.valid()) pending.wait();
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() = default;

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
  MUONPS_ASSIGN_OR_RETURN(const Device device, ParseDevice(options.device));
  const SecurityConfig security = WithEnvironmentDefaults(
      client_internal::ToSecurityConfig(options.security));
  MUONPS_ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> coordinator,
                          Channel(options.coordinator, security));
  MUONPS_ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::Channel> worker,
      Channel(absl::StrCat("unix:", options.worker_socket), security));
  return std::unique_ptr<Client>(new Client(std::make_unique<Impl>(
      options, device, v1::Coordinator::NewStub(std::move(coordinator)),
      v1::Worker::NewStub(std::move(worker)))));
}

Client::Impl::Tensor* Client::Impl::Find(const std::string& name) {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

const Client::Impl::Tensor* Client::Impl::Find(const std::string& name) const {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

absl::Status Client::Impl::CheckNotStarted(const std::string& field,
                                           const std::string& what) const {
  if (!started) return absl::OkStatus();
  return FieldError(absl::StatusCode::kFailedPrecondition, field,
                    absl::StrCat(what, " after Start"));
}

absl::Status Client::AddMatrix(const std::string& name, int64_t rows,
                               int64_t cols, const MatrixOptions& options) {
  Impl& s = *impl_;
  const std::string field = absl::StrCat("matrix ", Quoted(name));
  MUONPS_RETURN_IF_ERROR(s.CheckNotStarted(field, "added"));
  if (name.empty()) return InvalidField("name", "is empty");
  if (s.Find(name) != nullptr) return InvalidField(field, "is declared twice");
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
  Impl::Tensor t;
  t.name = name;
  t.muon = true;
  t.rows = rows;
  t.cols = cols;
  t.experts = options.experts;
  t.layer = options.layer;
  t.layout = client_internal::ToLayout(options.layout);
  if (options.shard_experts && t.layout != scheduler::Layout::kRowSharded) {
    return InvalidField(field + ".shard_experts",
                        "splits the experts of a row_sharded stack");
  }
  t.shard_experts = options.shard_experts;
  int64_t local_rows = rows * options.experts;
  if (t.layout == scheduler::Layout::kRowSharded) {
    local_rows = s.ShardRows(t);
    if (local_rows < 1) {
      return InvalidField(
          field,
          absl::StrCat(t.shard_experts ? options.experts : rows,
                       t.shard_experts ? " experts" : " rows", " split over ",
                       s.ShardCount(),
                       s.ShardCount() == s.options.trainer_count
                           ? " trainers"
                           : " trainers of a replica group (replicas)",
                       " as torch.chunk splits them leave none to trainer ",
                       s.options.trainer_rank));
    }
  }
  t.elements = local_rows * cols;
  t.param_elements =
      options.shard_params ? t.elements : rows * cols * options.experts;
  s.index[name] = s.tensors.size();
  s.tensors.push_back(std::move(t));
  ++s.matrices;
  return absl::OkStatus();
}

namespace {

// Zero-filled host AdamW moments of `elements` floats each. A tensor within
// the bounds may still not fit this host: RESOURCE_EXHAUSTED naming it
// (`field`), never an exception out of the client.
absl::Status ZeroMoments(const std::string& field, int64_t elements,
                         std::vector<float>* exp_avg,
                         std::vector<float>* exp_avg_sq) {
  try {
    exp_avg->assign(elements, 0.0f);
    exp_avg_sq->assign(elements, 0.0f);
  } catch (const std::bad_alloc&) {
    std::vector<float>().swap(*exp_avg);
    std::vector<float>().swap(*exp_avg_sq);
    return FieldError(
        absl::StatusCode::kResourceExhausted, field,
        absl::StrCat("its AdamW moments (2 x ", elements, " floats, ",
                     2 * elements * static_cast<int64_t>(sizeof(float)),
                     " bytes) do not fit in this host's memory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Client::AddTensor(const std::string& name, int64_t elements,
                               TensorLayout layout) {
  Impl& s = *impl_;
  const std::string field = absl::StrCat("tensor ", Quoted(name));
  MUONPS_RETURN_IF_ERROR(s.CheckNotStarted(field, "added"));
  if (name.empty()) return InvalidField("name", "is empty");
  if (s.Find(name) != nullptr) return InvalidField(field, "is declared twice");
  if (elements < 1 || elements > kMaxTensorElements) {
    return InvalidField(field, absl::StrCat("elements must be in [1, ",
                                            kMaxTensorElements, "]"));
  }
  if (layout == TensorLayout::kRowSharded) {
    return InvalidField(field, "AdamW tensors are replicated or unreduced");
  }
  if (s.device.is_cuda() && layout != TensorLayout::kUnreduced) {
    return InvalidField(field,
                        "a CUDA trainer steps its AdamW tensors itself; lend "
                        "only unreduced ones (the workers average their "
                        "gradients)");
  }
  Impl::Tensor t;
  t.name = name;
  t.layout = client_internal::ToLayout(layout);
  t.elements = elements;
  t.param_elements = elements;
  if (!s.device.is_cuda()) {
    MUONPS_RETURN_IF_ERROR(
        ZeroMoments(field, elements, &t.exp_avg, &t.exp_avg_sq));
  }
  s.index[name] = s.tensors.size();
  s.tensors.push_back(std::move(t));
  return absl::OkStatus();
}

absl::Status Client::SetGroup(int group,
                              const std::vector<std::string>& names) {
  Impl& s = *impl_;
  MUONPS_RETURN_IF_ERROR(s.CheckNotStarted("group", "set"));
  if (group < 0 || group >= kMaxParamGroups) {
    return InvalidField(
        "group", absl::StrCat(group, " is not in [0, ", kMaxParamGroups, ")"));
  }
  // All or nothing: every name is checked before any tensor moves.
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string field = absl::StrCat("names[", i, "]");
    const Impl::Tensor* t = s.Find(names[i]);
    if (t == nullptr) {
      return InvalidField(field,
                          absl::StrCat(Quoted(names[i]), " was not declared"));
    }
    if (t->group >= 0 || !seen.insert(names[i]).second) {
      return InvalidField(
          field, absl::StrCat(Quoted(names[i]), " is already in group ",
                              t->group >= 0 ? t->group : group));
    }
  }
  for (const std::string& name : names) s.Find(name)->group = group;
  if (!names.empty()) s.group_count = std::max(s.group_count, group + 1);
  return absl::OkStatus();
}

absl::Status Client::ExpectDedicatedWorkers(int count) {
  MUONPS_RETURN_IF_ERROR(impl_->CheckNotStarted("dedicated_workers", "set"));
  if (count < 0 || count > 1024) {
    return InvalidField("dedicated_workers",
                        absl::StrCat(count, " is not in [0, 1024]"));
  }
  impl_->dedicated_workers = count;
  return absl::OkStatus();
}

absl::Status Client::SetReplicas(int replicas) {
  Impl& s = *impl_;
  MUONPS_RETURN_IF_ERROR(s.CheckNotStarted("replicas", "set"));
  if (replicas < 0) {
    return InvalidField("replicas", absl::StrCat(replicas, " < 0"));
  }
  if (replicas > 1 && s.options.trainer_count % replicas != 0) {
    return InvalidField(
        "replicas",
        absl::StrCat(replicas, " replica groups do not divide trainer_count ",
                     s.options.trainer_count,
                     " (each group needs trainer_count / replicas ranks)"));
  }
  for (const Impl::Tensor& t : s.tensors) {
    if (t.muon && t.layout == scheduler::Layout::kRowSharded) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition, "replicas",
          absl::StrCat("set after row-sharded matrix ", Quoted(t.name),
                       " was declared; set it before declaring matrices "
                       "(their rows depend on it)"));
    }
  }
  s.replicas = replicas;
  return absl::OkStatus();
}

absl::Status Client::AllowMomentumReset(bool allow) {
  MUONPS_RETURN_IF_ERROR(impl_->CheckNotStarted("allow_momentum_reset", "set"));
  impl_->allow_momentum_reset = allow;
  return absl::OkStatus();
}

absl::Status Client::SetCheckpointing(const std::string& dir, int64_t every) {
  MUONPS_RETURN_IF_ERROR(impl_->CheckNotStarted("checkpoint_dir", "set"));
  if (dir.empty() || dir[0] != '/') {
    return InvalidField("checkpoint_dir",
                        absl::StrCat(Quoted(dir), " is not an absolute path"));
  }
  if (every < 0) {
    return InvalidField("checkpoint_every", absl::StrCat(every, " < 0"));
  }
  impl_->checkpoint_dir = dir;
  impl_->checkpoint_every = every;
  return absl::OkStatus();
}

absl::Status Client::LendCuda(const std::string& name, void* grad, void* param,
                              BufferDType dtype) {
  Impl& s = *impl_;
  const std::string field = absl::StrCat("matrix ", Quoted(name));
  MUONPS_RETURN_IF_ERROR(s.CheckNotStarted(field, "lent"));
  if (!s.device.is_cuda()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, field,
                      "LendCuda needs ClientOptions.device cuda:N");
  }
  Impl::Tensor* t = s.Find(name);
  if (t == nullptr) {
    return FieldError(absl::StatusCode::kNotFound, field, "was not declared");
  }
  if (t->cuda_param != nullptr) return InvalidField(field, "is lent twice");
  if (param == nullptr) {
    return InvalidField(field, "param must be a device buffer");
  }
  if (grad == nullptr && !t->muon) {
    return InvalidField(field,
                        "is an AdamW tensor: it lends a gradient buffer (only "
                        "a job matrix may place its gradient at every step)");
  }
  t->cuda_grad = grad;
  t->cuda_param = param;
  t->dtype = client_internal::ToDType(dtype);
  return absl::OkStatus();
}

absl::StatusOr<TensorBuffers> Client::Buffers(const std::string& name) const {
  const Impl::Tensor* t = impl_->Find(name);
  if (t == nullptr) {
    return FieldError(absl::StatusCode::kNotFound, "name",
                      absl::StrCat(Quoted(name), " was not declared"));
  }
  return impl_->BuffersOf(*t);
}

absl::StatusOr<TensorBuffers> Client::Impl::BuffersOf(const Tensor& t) const {
  TensorBuffers out;
  if (device.is_cuda()) {
    out.grad = static_cast<float*>(t.cuda_grad);
    out.param = static_cast<float*>(t.cuda_param);
    out.dtype = client_internal::ToBufferDType(t.dtype);
  } else if (!segment.has_value()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "name",
                      "buffers exist after Start");
  } else {
    char* base = static_cast<char*>(segment->data());
    out.grad = reinterpret_cast<float*>(base + t.offset);
    out.param = reinterpret_cast<float*>(base + t.offset + t.elements * 4);
  }
  out.elements = t.elements;
  out.param_elements = t.param_elements;
  out.row_begin = 0;
  out.row_end = t.rows;
  out.expert_end = t.experts;
  if (t.muon && t.layout == scheduler::Layout::kRowSharded) {
    if (t.shard_experts) {
      std::tie(out.expert_begin, out.expert_end) = RowRange(t.experts);
    } else {
      std::tie(out.row_begin, out.row_end) = RowRange(t.rows);
    }
  }
  return out;
}

int Client::Impl::ShardCount() const {
  return replicas > 1 ? options.trainer_count / replicas
                      : options.trainer_count;
}

std::pair<int64_t, int64_t> Client::Impl::RowRange(int64_t rows) const {
  const int shards = ShardCount();
  return TrainerRowRange(rows, options.trainer_rank % shards, shards);
}

int64_t Client::Impl::ShardRows(const Tensor& t) const {
  const int shards = ShardCount();
  return muonps::ShardRows(t.rows, t.experts, t.shard_experts,
                           options.trainer_rank % shards, shards);
}

}  // namespace muonps
