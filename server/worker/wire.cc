#include "server/worker/wire.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/translate.h"

namespace muonps {
namespace worker {
namespace {

CudaBufferRef CudaBufferFromProto(const v1::CudaBuffer& buffer) {
  return {buffer.ipc_handle(), buffer.offset()};
}

absl::StatusOr<TensorBinding> BindingFromProto(const v1::TensorBinding& t) {
  const std::string tensor = absl::StrCat("tensor ", Quoted(t.name()));
  TensorBinding out;
  out.name = t.name();
  out.muon = t.muon();
  out.elements = t.elements();
  out.param_elements = t.param_elements();
  if (!v1::DType_IsValid(t.dtype())) {
    return InvalidField(
        absl::StrCat(tensor, ".dtype"),
        absl::StrCat("unknown value ", static_cast<int>(t.dtype())));
  }
  out.dtype = proto::DTypeFromProto(t.dtype());
  if (!v1::Layout_IsValid(t.layout())) {
    return InvalidField(
        absl::StrCat(tensor, ".layout"),
        absl::StrCat("unknown value ", static_cast<int>(t.layout())));
  }
  out.layout = proto::LayoutFromProto(t.layout());
  out.grad_offset = t.grad_offset();
  out.param_offset = t.param_offset();
  out.grad_cuda = CudaBufferFromProto(t.grad_cuda());
  out.param_cuda = CudaBufferFromProto(t.param_cuda());
  if (!t.grad_ready_event().empty() && !t.muon()) {
    return InvalidField(absl::StrCat(tensor, ".grad_ready_event"),
                        "only job matrices lend one");
  }
  out.grad_ready_event = t.grad_ready_event();
  if (t.group() < 0 || t.group() > kMaxParamGroups) {
    return InvalidField(absl::StrCat(tensor, ".group"),
                        absl::StrCat(t.group(), " is outside [0, ",
                                     kMaxParamGroups, "] (0: no group)"));
  }
  out.group = t.group() - 1;
  return out;
}

}  // namespace

absl::StatusOr<AttachRequest> AttachRequestFromProto(
    const v1::AttachRequest& request) {
  AttachRequest out;
  out.trainer_rank = request.trainer_rank();
  out.trainer_count = request.trainer_count();
  out.segment = request.segment();
  out.segment_bytes = request.segment_bytes();
  out.device = request.device();
  out.ready_event = request.ready_event();
  out.done_counter = CudaBufferFromProto(request.done_counter());
  out.parameters_counter = CudaBufferFromProto(request.parameters_counter());
  out.trainer_pid = request.trainer_pid();
  if (request.has_step_record()) {
    out.step_record_offset = request.step_record().segment_offset();
    out.step_record_cuda = CudaBufferFromProto(request.step_record().cuda());
  }
  out.tensors.reserve(request.tensors_size());
  for (const v1::TensorBinding& t : request.tensors()) {
    MUONPS_ASSIGN_OR_RETURN(TensorBinding binding, BindingFromProto(t));
    out.tensors.push_back(std::move(binding));
  }
  return out;
}

v1::AttachResponse AttachResponseToProto(const AttachResponse& response) {
  v1::AttachResponse out;
  out.set_plan_version(response.plan_version);
  out.set_rank(response.rank);
  return out;
}

StepRequest StepRequestFromProto(const v1::StepRequest& request) {
  StepRequest out;
  out.step_id = request.step_id();
  out.lr = request.lr();
  out.weight_decay = request.weight_decay();
  out.adamw_lr = request.adamw_lr();
  if (request.has_resumed_after()) out.resumed_after = request.resumed_after();
  out.groups.reserve(request.groups_size());
  for (const v1::GroupHyperparameters& g : request.groups()) {
    out.groups.push_back(
        {g.lr(), g.weight_decay(), g.adamw_lr(), g.adamw_weight_decay()});
  }
  out.gradients.reserve(request.gradients_size());
  for (const v1::GradientPlace& g : request.gradients()) {
    out.gradients.push_back({g.matrix(), CudaBufferFromProto(g.buffer())});
  }
  return out;
}

v1::StepResponse StepResponseToProto(const StepResponse& response) {
  v1::StepResponse out;
  out.set_step_id(response.step_id);
  out.set_already_applied(response.already_applied);
  out.set_last_step(response.last_step);
  out.set_repaired(response.repaired);
  out.set_seconds(response.seconds);
  out.set_ns_seconds(response.ns_seconds);
  out.set_predicted_ns_seconds(response.predicted_ns_seconds);
  out.set_bytes_moved(response.bytes_moved);
  out.set_momentum_reset(response.momentum_reset);
  out.set_plan_version(response.plan_version);
  return out;
}

absl::StatusOr<JobPlan> JobPlanFromProto(const v1::JobSpec& job,
                                         const v1::Plan& plan) {
  JobPlan out;
  out.job.name = job.name();
  out.job.matrices = proto::MatricesFromJob(job);
  out.job.muon = proto::MuonFromProto(job.muon());
  // The plan's bound when it names one (every worker cuts the same
  // buckets), else the job's.
  if (plan.bucket_bytes() > 0) {
    out.job.bucket_bytes = plan.bucket_bytes();
  } else if (job.bucket_bytes() > 0) {
    out.job.bucket_bytes = job.bucket_bytes();
  }
  out.job.apply_at_commit = plan.apply_at_commit();
  out.job.dedicated_workers = job.dedicated_workers();
  out.job.replicas = job.replicas();
  out.job.allow_momentum_reset = job.allow_momentum_reset();
  out.job.checkpoint_dir = job.checkpoint_dir();
  out.job.checkpoint_every = job.checkpoint_every();
  out.membership = MembershipFromProto(plan);
  MUONPS_ASSIGN_OR_RETURN(out.ownership,
                          proto::OwnershipFromPlan(plan, out.job.matrices));
  return out;
}

PlanMembership MembershipFromProto(const v1::Plan& plan) {
  return {plan.version(),
          {plan.workers().begin(), plan.workers().end()},
          plan.reason()};
}

}  // namespace worker
}  // namespace muonps
