// Client::Step and Wait: the Step RPC to the local worker (attaching
// again to a worker that restarted), async steps of CUDA trainers, and
// the AdamW part host trainers run here once a step commits. The rest
// of Client is in client.cc.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <future>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/cuda_lending.h"
#include "common/status.h"
#include "lending/trainer_segment.h"
#include "proto/grpc_status.h"

namespace muonps {

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
