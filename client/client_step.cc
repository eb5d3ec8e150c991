// Client::Step and Wait: the step's values checked before anything is
// sent, the step request (each parameter group's values by index), the
// Step RPC to the local worker (attaching again to a worker that
// restarted), and async steps of CUDA trainers; and GradientReady, a CUDA
// trainer's word that one gradient is final before its step. Host trainers'
// AdamW part is in client_adamw.cc.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/client_impl.h"
#include "client/cuda_lending.h"
#include "common/status.h"
#include "lending/parameter_progress.h"
#include "lending/trainer_segment.h"
#include "proto/grpc_status.h"

namespace muonps {
namespace {

// INVALID_ARGUMENT naming `field` unless `value` is finite (a negative
// value keeps a default; NaN and the infinities keep nothing).
absl::Status CheckFinite(const std::string& field, double value) {
  if (std::isfinite(value)) return absl::OkStatus();
  return InvalidField(field, absl::StrCat(value,
                                          " is not finite (a value "
                                          "< 0 keeps the default)"));
}

// Every value of `options` finite, the groups within what SetGroup used.
absl::Status CheckStepOptions(const StepOptions& options, int group_count) {
  MUONPS_RETURN_IF_ERROR(CheckFinite("lr", options.lr));
  MUONPS_RETURN_IF_ERROR(CheckFinite("weight_decay", options.weight_decay));
  MUONPS_RETURN_IF_ERROR(CheckFinite("adamw_lr", options.adamw_lr));
  if (options.groups.size() > static_cast<size_t>(Client::kMaxParamGroups)) {
    return InvalidField(
        "groups", absl::StrCat(options.groups.size(), " entries; at most ",
                               Client::kMaxParamGroups));
  }
  const int given = static_cast<int>(options.groups.size());
  if (given > 0 && given < group_count) {
    return InvalidField("groups",
                        absl::StrCat(given, " entries; tensors were put in ",
                                     group_count, " groups (SetGroup)"));
  }
  for (int i = 0; i < given; ++i) {
    const GroupHyperparameters& g = options.groups[i];
    for (const auto& [field, value] :
         {std::pair<const char*, double>{"lr", g.lr},
          {"weight_decay", g.weight_decay},
          {"adamw_lr", g.adamw_lr},
          {"adamw_weight_decay", g.adamw_weight_decay}}) {
      MUONPS_RETURN_IF_ERROR(
          CheckFinite(absl::StrCat("groups[", i, "].", field), value));
    }
  }
  return absl::OkStatus();
}

// The request the workers take: the step's values and each group's by
// index, as given (the groups were registered at attach).
v1::StepRequest StepRequestOf(int64_t step_id, const StepOptions& options) {
  v1::StepRequest request;
  request.set_step_id(step_id);
  request.set_lr(options.lr);
  request.set_weight_decay(options.weight_decay);
  // Agreed among the trainers like lr (the workers refuse a step whose
  // trainers' AdamW values differ).
  request.set_adamw_lr(options.adamw_lr);
  request.mutable_groups()->Reserve(static_cast<int>(options.groups.size()));
  for (const GroupHyperparameters& g : options.groups) {
    v1::GroupHyperparameters* out = request.add_groups();
    out->set_lr(g.lr);
    out->set_weight_decay(g.weight_decay);
    out->set_adamw_lr(g.adamw_lr);
    out->set_adamw_weight_decay(g.adamw_weight_decay);
  }
  return request;
}

}  // namespace

absl::StatusOr<StepResult> Client::Step(int64_t step_id,
                                        const StepOptions& options) {
  Impl& s = *impl_;
  if (!s.started) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "step_id",
                      "Step before Start");
  }
  // Checked before the workers apply anything: a bad value must not leave
  // the Muon part applied and the AdamW part refused.
  MUONPS_RETURN_IF_ERROR(CheckStepOptions(options, s.group_count));
  Impl::AdamWValues adamw = s.ResolveAdamW(options);
  v1::StepRequest request = StepRequestOf(step_id, options);
  if (s.resumed_after.has_value()) {
    request.set_resumed_after(*s.resumed_after);
  }
  if (!s.device.is_cuda()) return s.StepOnWorker(request, adamw);
  // A previous async step first: its failure is this call's answer.
  if (s.pending.valid()) MUONPS_RETURN_IF_ERROR(s.pending.get().status());
  if (options.forward_waits && !options.async) {
    return InvalidField("forward_waits",
                        "needs async (a step that returns once done has "
                        "nothing left for the forward to wait for)");
  }
  for (const Impl::Tensor& t : s.tensors) {
    if (t.muon && t.cuda_grad == nullptr &&
        s.placed.count(t.gradient_event) == 0) {
      return InvalidField(absl::StrCat("matrix ", Quoted(t.name)),
                          "lends no gradient buffer: PlaceGradient its "
                          "gradient before every Step");
    }
  }
  for (auto& [position, buffer] : s.placed) {
    v1::GradientPlace* place = request.add_gradients();
    place->set_matrix(position);
    *place->mutable_buffer() = std::move(buffer);
  }
  s.placed.clear();
  MUONPS_RETURN_IF_ERROR(s.signals->BeforeStep(
      options.stream, step_id, /*wait_for_step=*/!options.forward_waits));
  s.enqueued_step = step_id;
  // Answered (or failed): the worker took this step's waits on the
  // gradient events, and GradientReady may record them for the next one.
  const auto answered = [&s](const v1::StepRequest& request,
                             const Impl::AdamWValues& adamw) {
    absl::StatusOr<StepResult> result = s.StepOnWorker(request, adamw);
    s.signals->StepAnswered();
    return result;
  };
  if (!options.async) return answered(request, adamw);
  s.pending = std::async(
      std::launch::async,
      [answered, request = std::move(request), adamw = std::move(adamw)] {
        return answered(request, adamw);
      });
  StepResult enqueued;
  enqueued.pending = true;
  return enqueued;
}

absl::StatusOr<const Client::Impl::Tensor*> Client::Impl::StartedCudaMatrix(
    const std::string& name, const char* call, const char* host) const {
  const std::string field = absl::StrCat("matrix ", Quoted(name));
  if (!device.is_cuda()) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, field,
        absl::StrCat(call, " needs ClientOptions.device cuda:N (", host, ")"));
  }
  const Tensor* t = Find(name);
  if (t == nullptr) {
    return FieldError(absl::StatusCode::kNotFound, field, "was not declared");
  }
  if (!t->muon) {
    return FieldError(absl::StatusCode::kNotFound,
                      absl::StrCat("tensor ", Quoted(name)),
                      absl::StrCat("is an AdamW tensor: ", call,
                                   " takes job matrices lent with LendCuda"));
  }
  if (!started) {
    return InvalidField(field, absl::StrCat(call,
                                            " before Start (which lends the "
                                            "matrix's gradient event)"));
  }
  return t;
}

absl::Status Client::GradientReady(const std::string& name,
                                   CUstream_st* stream) {
  MUONPS_ASSIGN_OR_RETURN(
      const Impl::Tensor* t,
      impl_->StartedCudaMatrix(name, "GradientReady",
                               "a host trainer's Step orders its gradients"));
  return Annotate(impl_->signals->GradientReady(t->gradient_event, stream),
                  absl::StrCat("matrix ", Quoted(name)));
}

absl::Status Client::PlaceGradient(const std::string& name, const void* data) {
  MUONPS_ASSIGN_OR_RETURN(
      const Impl::Tensor* t,
      impl_->StartedCudaMatrix(
          name, "PlaceGradient",
          "a host trainer's gradients stay in its segment"));
  MUONPS_ASSIGN_OR_RETURN(
      v1::CudaBuffer buffer,
      client_internal::ExportCudaBuffer(
          data, t->elements, t->dtype, impl_->device,
          absl::StrCat("matrix ", Quoted(name), " gradient")));
  impl_->placed[t->gradient_event] = std::move(buffer);
  return absl::OkStatus();
}

absl::StatusOr<void*> Client::AllocateGradient(const std::string& name) {
  MUONPS_ASSIGN_OR_RETURN(
      const Impl::Tensor* t,
      impl_->StartedCudaMatrix(
          name, "AllocateGradient",
          "a host trainer's gradients stay in its segment"));
  return client_internal::AllocateLendable(
      impl_->device, t->elements * static_cast<int64_t>(DTypeSize(t->dtype)),
      absl::StrCat("matrix ", Quoted(name), " gradient"));
}

absl::Status Client::FreeCudaMemory(void* data) {
  return client_internal::FreeLendable(data);
}

absl::Status Client::WaitForParameters(CUstream_st* stream, int64_t matrices) {
  Impl& s = *impl_;
  if (!s.device.is_cuda()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "stream",
                      "WaitForParameters needs ClientOptions.device cuda:N "
                      "(a host trainer's Step returns once it is applied)");
  }
  if (matrices < kAllParameters || matrices > s.matrices) {
    return InvalidField("matrices",
                        absl::StrCat(matrices,
                                     " is neither -1 (all) nor in "
                                     "[0, ",
                                     s.matrices, "], the job's matrices"));
  }
  if (s.enqueued_step < 0) return absl::OkStatus();
  return s.signals->WaitForParameters(stream, s.enqueued_step,
                                      matrices == kAllParameters
                                          ? kAllMatrices
                                          : static_cast<uint32_t>(matrices));
}

absl::Status Client::ResumeAfter(int64_t step) {
  if (step < -1) {
    return InvalidField("step", absl::StrCat(step, " < -1"));
  }
  Impl& s = *impl_;
  if (s.pending.valid()) MUONPS_RETURN_IF_ERROR(s.pending.get().status());
  s.resumed_after = step;
  s.highest_sent_step = step;
  s.last_adamw_step = step;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Client::Wait() {
  if (!impl_->pending.valid()) return StepResult{};
  return impl_->pending.get();
}

absl::Status Client::Impl::CallStep(const v1::StepRequest& request,
                                    v1::StepResponse* response) {
  absl::Status rpc;
  for (int attempt = 0; attempt < 2; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(options.timeout));
    // Named by its socket: when the worker died mid-step, gRPC's own text
    // ("Socket closed", "Connection refused") would not say which one.
    rpc = FromGrpc(
        worker->Step(&context, request, response),
        absl::StrCat("Step on the worker at unix:", options.worker_socket));
    // This client never cancels a step: the worker stopped during the call
    // (it shut down, or dropped its transport). Steps are idempotent, so
    // that is a retry's case.
    if (absl::IsCancelled(rpc)) {
      rpc = absl::UnavailableError(absl::StrCat(
          rpc.message(), " (the worker stopped during the call; retry)"));
    }
    // A worker that restarted has no buffers of this trainer: nothing ran.
    if (attempt > 0 || !absl::IsFailedPrecondition(rpc) ||
        !absl::StrContains(rpc.message(), kNoTrainerAttached)) {
      break;
    }
    MUONPS_RETURN_IF_ERROR(WaitAndAttach());
  }
  return rpc;
}

absl::StatusOr<StepResult> Client::Impl::StepOnWorker(
    const v1::StepRequest& request, const AdamWValues& adamw) {
  // Serialized: a pending async step ends before the next one starts.
  const int64_t step_id = request.step_id();
  const bool sent_before = step_id <= highest_sent_step;
  highest_sent_step = std::max(highest_sent_step, step_id);
  v1::StepResponse response;
  const absl::Status rpc = CallStep(request, &response);
  if (!rpc.ok()) {
    // The worker may not have released the trainer's stream.
    if (signals != nullptr) signals->Release(step_id).IgnoreError();
    return rpc;
  }
  resumed_after.reset();  // answered: the worker knows
  if (response.already_applied() && !sent_before && !response.repaired()) {
    // Committed by an earlier trainer of this rank (it died after its
    // worker committed): these parameters miss that update, and going on
    // would diverge without a word. The worker did not run it, so nothing
    // released the trainer's stream.
    if (signals != nullptr) signals->Release(step_id).IgnoreError();
    const int64_t last = std::max(step_id, response.last_step());
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "step_id",
        absl::StrCat(
            "the workers had already applied step ", step_id, " of job ",
            Quoted(options.job), " (committed through step ", last,
            ") before this client sent it: an earlier trainer of rank ",
            options.trainer_rank,
            " stepped it, and these parameters miss its updates. Load the "
            "parameters and optimizer state saved after step ",
            last, " and continue with step ", last + 1,
            ", or start a new job"));
  }
  StepResult result;
  result.already_applied = response.already_applied();
  result.repaired = response.repaired();
  result.seconds = response.seconds();
  result.bytes_moved = response.bytes_moved();
  result.momentum_reset = response.momentum_reset();
  result.plan_version = response.plan_version();
  // A CUDA trainer steps its AdamW tensors itself, on its stream, after
  // the workers averaged their gradients.
  if (device.is_cuda()) return result;
  // Committed (fresh, or by an earlier call whose answer was lost): the
  // workers averaged the AdamW gradients into the lent buffers when it
  // committed.
  MUONPS_RETURN_IF_ERROR(ApplyAdamW(request.step_id(), adamw, &result));
  return result;
}

}  // namespace muonps
