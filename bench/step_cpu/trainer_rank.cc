#include "bench/step_cpu/trainer_rank.h"

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/status.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "muonps/v1/worker.grpc.pb.h"
#include "proto/credentials.h"
#include "proto/grpc_status.h"
#include "tests/client_options.h"

namespace muonps {
namespace bench {
namespace {

constexpr absl::Duration kPlanTimeout = absl::Seconds(60);
constexpr absl::Duration kStepTimeout = absl::Seconds(120);

// Waits until the coordinator's latest plan has every worker and this
// rank's worker follows it: a worker that joined second triggers a
// re-plan, and a step under a stale plan would time a transport rebuild.
absl::Status WaitForFullPlan(const TrainerRankOptions& options,
                             v1::Worker::Stub* worker) {
  auto coordinator = v1::Coordinator::NewStub(
      *OpenChannel(options.coordinator, WithEnvironmentDefaults({})));
  const absl::Time deadline = absl::Now() + kPlanTimeout;
  std::string last;
  while (absl::Now() < deadline) {
    grpc::ClientContext plan_context;
    plan_context.set_deadline(DeadlineIn(absl::Seconds(5)));
    v1::GetPlanRequest request;
    request.set_job(options.job);
    v1::Plan plan;
    grpc::Status status = coordinator->GetPlan(&plan_context, request, &plan);
    grpc::ClientContext status_context;
    status_context.set_deadline(DeadlineIn(absl::Seconds(5)));
    v1::WorkerStatus worker_status;
    if (status.ok()) {
      status = worker->GetStatus(&status_context, v1::GetStatusRequest(),
                                 &worker_status);
    }
    if (status.ok() && plan.workers_size() == options.workers &&
        worker_status.plan_version() == plan.version() &&
        worker_status.state() == "ready") {
      return absl::OkStatus();
    }
    last = status.ok() ? absl::StrCat("plan ", plan.version(), " has ",
                                      plan.workers_size(), " workers; worker ",
                                      worker_status.worker_id(), " is ",
                                      worker_status.state(), " on plan ",
                                      worker_status.plan_version())
                       : status.error_message();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "rank ", options.rank, ": no plan with ", options.workers, " workers in ",
      absl::FormatDuration(kPlanTimeout), " (", last, ")"));
}

// One step through the worker's RPC (what Client::Step sends), keeping the
// worker's own timings.
absl::StatusOr<v1::StepResponse> RpcStep(v1::Worker::Stub* worker,
                                         int64_t step_id) {
  v1::StepRequest request;
  request.set_step_id(step_id);
  // proto3 defaults are 0: ask for the job's lr and weight decay.
  request.set_lr(-1);
  request.set_weight_decay(-1);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(kStepTimeout));
  v1::StepResponse response;
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(worker->Step(&context, request, &response), "Step"));
  if (response.already_applied()) {
    return absl::FailedPreconditionError(
        absl::StrCat("step_id: ", step_id, " was already applied"));
  }
  return response;
}

absl::StatusOr<TrainerRankResult> Run(const TrainerRankOptions& options,
                                      LockstepBarrier* barrier) {
  auto worker = v1::Worker::NewStub(
      *OpenChannel(absl::StrCat("unix:", options.worker_socket),
                   WithEnvironmentDefaults({})));
  MUONPS_ASSIGN_OR_RETURN(
      std::unique_ptr<Client> client,
      Client::Create({.coordinator = options.coordinator,
                      .job = options.job,
                      .worker_socket = options.worker_socket,
                      .trainer_rank = options.rank,
                      .trainer_count = options.ranks,
                      .timeout = kStepTimeout}));
  for (const StepMatrix& m : options.matrices) {
    MUONPS_RETURN_IF_ERROR(
        client->AddMatrix(m.name, m.rows, m.cols,
                          {.layout = TensorLayout::kUnreduced,
                           .layer = m.layer,
                           .shard_params = false}));
  }
  // StepMuonHyperparameters() as the client takes them (the one-process
  // peer runs the kernels' own).
  MUONPS_RETURN_IF_ERROR(client->Start(
      testing::ClientMuon(StepMuonHyperparameters()), AdamWOptions()));
  std::vector<TensorBuffers> buffers;
  for (size_t i = 0; i < options.matrices.size(); ++i) {
    MUONPS_ASSIGN_OR_RETURN(TensorBuffers b,
                            client->Buffers(options.matrices[i].name));
    FillInitialParameters(static_cast<int>(i), b.param, b.param_elements);
    FillGradient(options.rank, static_cast<int>(i), b.grad, b.elements);
    buffers.push_back(b);
  }
  MUONPS_RETURN_IF_ERROR(WaitForFullPlan(options, worker.get()));

  TrainerRankResult result;
  int64_t step_id = 0;
  const int client_steps = options.warmup_steps + options.timed_steps;
  for (int s = 0; s < client_steps + options.probe_steps; ++s, ++step_id) {
    if (!barrier->Wait()) return absl::AbortedError("another rank failed");
    RankStep step;
    step.start = std::chrono::steady_clock::now();
    if (s < client_steps) {
      MUONPS_ASSIGN_OR_RETURN(const StepResult r, client->Step(step_id));
      step.end = std::chrono::steady_clock::now();
      if (r.already_applied) {
        return absl::FailedPreconditionError(
            absl::StrCat("step_id: ", step_id, " was already applied"));
      }
      step.bytes_moved = r.bytes_moved;
      step.plan_version = r.plan_version;
      step.momentum_reset = r.momentum_reset;
      if (s >= options.warmup_steps) result.timed.push_back(step);
    } else {
      MUONPS_ASSIGN_OR_RETURN(const v1::StepResponse r,
                              RpcStep(worker.get(), step_id));
      step.end = std::chrono::steady_clock::now();
      step.bytes_moved = r.bytes_moved();
      step.plan_version = r.plan_version();
      step.momentum_reset = r.momentum_reset();
      step.worker_seconds = r.seconds();
      step.ns_seconds = r.ns_seconds();
      result.probes.push_back(step);
    }
    // The peer's turn.
    if (!barrier->Wait()) return absl::AbortedError("another rank failed");
  }
  for (const TensorBuffers& b : buffers) {
    result.final_params.insert(result.final_params.end(), b.param,
                               b.param + b.param_elements);
  }
  return result;
}

}  // namespace

bool LockstepBarrier::Wait() {
  absl::MutexLock lock(&mu_);
  if (aborted_) return false;
  const int64_t generation = generation_;
  if (++waiting_ == parties_) {
    waiting_ = 0;
    ++generation_;
    changed_.SignalAll();
    return true;
  }
  while (generation_ == generation && !aborted_) changed_.Wait(&mu_);
  return !aborted_;
}

void LockstepBarrier::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
  changed_.SignalAll();
}

absl::StatusOr<TrainerRankResult> RunTrainerRank(
    const TrainerRankOptions& options, LockstepBarrier* barrier) {
  absl::StatusOr<TrainerRankResult> result = Run(options, barrier);
  if (!result.ok()) {
    barrier->Abort();
    return Annotate(result.status(),
                    absl::StrCat("trainer rank ", options.rank));
  }
  return result;
}

}  // namespace bench
}  // namespace muonps
