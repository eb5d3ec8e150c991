// Client::Start and the plan: lays out the trainer's buffers (a shared
// segment, or the CUDA buffers lent with LendCuda and each job matrix's
// gradient event), creates the job or checks that an existing one matches,
// and attaches every tensor, with its parameter group, to the local worker
// once it follows a plan; and NsAlgorithms, the plan's algorithm per
// matrix.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/client_impl.h"
#include "client/cuda_lending.h"
#include "client/internal_types.h"
#include "common/status.h"
#include "lending/step_record.h"
#include "lending/trainer_segment.h"
#include "proto/grpc_status.h"
#include "proto/translate.h"

namespace muonps {
namespace {

// `call(context)` with wait_for_ready until `wait_until` (a coordinator not
// up yet, or restarting, is waited for: the channel reconnects with
// backoff), sent again while it fails UNAVAILABLE (the coordinator went down
// during the call). DEADLINE_EXCEEDED once `wait_until` passed.
template <typename Call>
grpc::Status CallWhileDown(absl::Time wait_until, const Call& call) {
  grpc::Status status(grpc::StatusCode::DEADLINE_EXCEEDED, "");
  while (absl::Now() < wait_until) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(wait_until));
    status = call(&context);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return status;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                      status.error_message());
}

}  // namespace

absl::Status Client::Impl::EnsureJob(const kernels::MuonHyperparameters& muon,
                                     const kernels::AdamWHyperparameters& adamw,
                                     std::optional<NsAlgorithm> ns_algorithm) {
  v1::CreateJobRequest request;
  // Every rank sends the same request id: the first creates, the others'
  // calls are retries of it.
  request.set_request_id(absl::StrCat("client:", options.job));
  v1::JobSpec* spec = request.mutable_job();
  spec->set_name(options.job);
  spec->set_dedicated_workers(dedicated_workers);
  // The plans rank this many workers with trainers; another worker that
  // joins is a standby, not a rank every step waits for.
  spec->set_trainers(options.trainer_count);
  // HSDP's replica groups; 1 is none, sent as 0 so that the spec matches
  // a job created without them.
  spec->set_replicas(replicas > 1 ? replicas : 0);
  spec->set_allow_momentum_reset(allow_momentum_reset);
  spec->set_checkpoint_dir(checkpoint_dir);
  spec->set_checkpoint_every(checkpoint_every);
  for (const Tensor& t : tensors) {
    if (!t.muon) continue;
    v1::Matrix* m = spec->add_matrices();
    m->set_name(t.name);
    m->set_rows(t.rows);
    m->set_cols(t.cols);
    m->set_experts(t.experts);
    m->set_dtype(proto::DTypeToProto(t.dtype));
    m->set_layout(proto::LayoutToProto(t.layout));
    m->set_layer(t.layer);
    m->set_shard_experts(t.shard_experts);
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
    h->set_ns_algorithm(proto::NsAlgorithmToProto(*ns_algorithm));
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
  // A coordinator not up yet, or restarting, is waited for (the channel
  // reconnects with backoff) for all but the last 2 s of the client's
  // timeout: trainers may start before it. A call cut short because the
  // coordinator went down during it (UNAVAILABLE) is sent again meanwhile.
  // Then one attempt that does not wait, whose error says why none
  // answered (refused, a failed TLS handshake). CreateJob's request id
  // makes a repeat harmless.
  constexpr absl::Duration kLastAttempt = absl::Seconds(2);
  v1::Job job;
  grpc::Status status =
      CallWhileDown(absl::Now() + options.timeout - kLastAttempt,
                    [&](grpc::ClientContext* context) {
                      return coordinator->CreateJob(context, request, &job);
                    });
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(std::min(kLastAttempt, options.timeout)));
    status = coordinator->CreateJob(&context, request, &job);
  }
  if (status.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
    return FromGrpc(status, "CreateJob");
  }
  // A job of this name from another run: usable if its matrices match.
  v1::GetJobRequest get;
  get.set_job(options.job);
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(CallWhileDown(absl::Now() + absl::Seconds(10),
                             [&](grpc::ClientContext* context) {
                               return coordinator->GetJob(context, get, &job);
                             }),
               "GetJob"));
  if (job.spec().SerializeAsString() != spec->SerializeAsString()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "job",
                      absl::StrCat(Quoted(options.job),
                                   " exists with other matrices or "
                                   "hyperparameters"));
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::WaitAndAttach() {
  v1::AttachRequest attach;
  attach.set_trainer_rank(options.trainer_rank);
  attach.set_trainer_count(options.trainer_count);
  attach.set_trainer_pid(getpid());
  if (segment.has_value()) {
    attach.set_segment(segment->name());
    attach.set_segment_bytes(static_cast<int64_t>(segment->size()));
    attach.mutable_step_record()->set_segment_offset(step_record_offset);
  } else {
    attach.set_device(DeviceName(device));
    if (signals != nullptr) MUONPS_RETURN_IF_ERROR(signals->Describe(&attach));
  }
  for (const Tensor& t : tensors) {
    v1::TensorBinding* b = attach.add_tensors();
    b->set_name(t.name);
    if (device.is_cuda()) {
      const std::string field = absl::StrCat("matrix ", Quoted(t.name));
      // A job matrix that lends no gradient buffer places its gradient at
      // every step (PlaceGradient).
      if (t.cuda_grad != nullptr) {
        MUONPS_ASSIGN_OR_RETURN(
            *b->mutable_grad_cuda(),
            client_internal::ExportCudaBuffer(t.cuda_grad, t.elements, t.dtype,
                                              device, field + " grad"));
      }
      MUONPS_ASSIGN_OR_RETURN(
          *b->mutable_param_cuda(),
          client_internal::ExportCudaBuffer(t.cuda_param, t.param_elements,
                                            t.dtype, device, field + " param"));
      if (t.gradient_event >= 0 && signals != nullptr) {
        absl::StatusOr<std::string> event =
            signals->ExportGradientEvent(t.gradient_event);
        if (!event.ok()) {
          return Annotate(event.status(), field + " grad_ready_event");
        }
        b->set_grad_ready_event(*std::move(event));
      }
    }
    b->set_grad_offset(t.offset);
    b->set_param_offset(t.offset + t.elements * 4);
    b->set_elements(t.elements);
    b->set_param_elements(t.param_elements);
    b->set_dtype(proto::DTypeToProto(t.dtype));
    b->set_layout(proto::LayoutToProto(t.layout));
    b->set_muon(t.muon);
    b->set_group(t.group + 1);  // 0: in no group
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  grpc::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(DeadlineIn(absl::Seconds(5)));
    v1::AttachResponse response;
    last = worker->Attach(&context, attach, &response);
    // FAILED_PRECONDITION: no plan yet; UNAVAILABLE: the worker is starting.
    if (last.ok()) return absl::OkStatus();
    if (last.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
        last.error_code() != grpc::StatusCode::UNAVAILABLE) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return FromGrpc(
      last, absl::StrCat("Attach to the worker at ", options.worker_socket));
}

absl::Status Client::Start(const MuonOptions& muon_options,
                           const AdamWOptions& adamw_options) {
  Impl& s = *impl_;
  if (s.started) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "Start",
                      "called twice");
  }
  const kernels::MuonHyperparameters muon =
      client_internal::ToMuonHyperparameters(muon_options);
  const kernels::AdamWHyperparameters adamw =
      client_internal::ToAdamWHyperparameters(adamw_options);
  MUONPS_RETURN_IF_ERROR(kernels::ValidateMuonHyperparameters(muon));
  MUONPS_RETURN_IF_ERROR(kernels::ValidateAdamWHyperparameters(adamw));
  bool any_matrix = false;
  int64_t bytes = 0;
  for (Impl::Tensor& t : s.tensors) {
    any_matrix = any_matrix || t.muon;
    t.offset = bytes;
    bytes += (t.elements + t.param_elements) * 4;
  }
  if (!any_matrix) return InvalidField("matrices", "none was added");
  // The step record after the tensors, zero-filled like the whole segment
  // (the record of parameters no worker has written).
  s.step_record_offset = (bytes + 63) / 64 * 64;
  bytes = s.step_record_offset + static_cast<int64_t>(kStepRecordBytes);
  s.adamw = adamw;
  if (s.device.is_cuda()) {
    // Each job matrix gets its own gradient event (the worker takes one for
    // job matrices only).
    int gradient_events = 0;
    for (Impl::Tensor& t : s.tensors) {
      if (t.cuda_param == nullptr) {
        return FieldError(absl::StatusCode::kFailedPrecondition,
                          absl::StrCat("matrix ", Quoted(t.name)),
                          "was not lent (LendCuda) before Start");
      }
      if (t.muon) t.gradient_event = gradient_events++;
    }
    MUONPS_ASSIGN_OR_RETURN(s.signals, client_internal::CudaStepSignals::Create(
                                           s.device, gradient_events));
  } else {
    MUONPS_ASSIGN_OR_RETURN(
        SharedMemorySegment segment,
        SharedMemorySegment::Create(
            // The form the worker checks (lending/trainer_segment.h).
            TrainerSegmentName(s.options.job, s.options.trainer_rank, getpid(),
                               std::random_device()()),
            static_cast<size_t>(bytes)));
    s.segment = std::move(segment);
  }
  MUONPS_RETURN_IF_ERROR(s.EnsureJob(
      muon, adamw, client_internal::ToNsAlgorithm(muon_options.ns_algorithm)));
  MUONPS_RETURN_IF_ERROR(s.WaitAndAttach());
  s.started = true;
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, NewtonSchulz>> Client::NsAlgorithms()
    const {
  if (!impl_->started) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "NsAlgorithms",
                      "called before Start");
  }
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(absl::Seconds(10)));
  v1::GetPlanRequest request;
  request.set_job(impl_->options.job);
  v1::Plan plan;
  MUONPS_RETURN_IF_ERROR(FromGrpc(
      impl_->coordinator->GetPlan(&context, request, &plan), "GetPlan"));
  std::map<std::string, NewtonSchulz> out;
  for (const v1::Batch& batch : plan.batches()) {
    for (const std::string& member : batch.matrices()) {
      // Members are "name" or "name[expert]".
      const std::string name = member.substr(0, member.find('['));
      out.emplace(name, client_internal::FromNsAlgorithm(
                            proto::NsAlgorithmFromProto(batch.algorithm())));
    }
  }
  return out;
}

}  // namespace muonps
