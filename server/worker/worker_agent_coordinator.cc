// WorkerAgent's calls to the coordinator: joining (again after a lost
// lease) with backoff, the heartbeat loop and leaving, the plan watch and
// handing each plan to the engine, and sending the queued step stats. The
// rest of WorkerAgent is in worker_agent.cc.
#include <algorithm>
#include <chrono>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "proto/grpc_status.h"
#include "server/worker/backoff.h"
#include "server/worker/wire.h"
#include "server/worker/worker_agent.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// Deadline for unary calls to the coordinator.
std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

// A heartbeat answer that says the coordinator no longer knows this
// membership (as opposed to one that is down or slow: those are retried).
bool LeaseIsLost(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::NOT_FOUND:            // the job or the worker
    case grpc::StatusCode::FAILED_PRECONDITION:  // instance, stale version
    case grpc::StatusCode::INVALID_ARGUMENT:     // stale version, old servers
    case grpc::StatusCode::UNAUTHENTICATED:      // a token it never issued
      return true;
    default:
      return false;
  }
}

}  // namespace

bool WorkerAgent::JoinWithRetry() {
  v1::JoinJobRequest request;
  request.set_job(options_.job);
  request.set_worker_id(options_.worker_id);
  request.set_instance_id(instance_id_);
  *request.mutable_device() = options_.device;
  request.set_cost_table(options_.cost_table);
  request.set_speed(options_.speed);
  request.set_data_address(options_.data_address);
  request.set_dedicated(options_.dedicated);
  Backoff backoff;
  int64_t failures = 0;
  while (!stop_.HasBeenNotified()) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(5)));
    v1::JoinJobResponse response;
    const grpc::Status status = stub_->JoinJob(&context, request, &response);
    if (status.ok()) {
      options_.credentials->Set(response.worker_token(),
                                response.data_plane_secret());
      // The engine takes its lock for a new secret (waiting for a step in
      // progress): only when it changed, so a re-join after a coordinator
      // restart keeps heartbeats from waiting on a step.
      if (engine_ != nullptr &&
          response.data_plane_secret() != engine_secret_) {
        engine_->SetDataPlaneSecret(response.data_plane_secret());
        engine_secret_ = response.data_plane_secret();
      }
      absl::MutexLock lock(&mu_);
      ++join_epoch_;
      // After a lost lease it stays "lost" until the current plan arrives.
      if (lost_at_epoch_ < 0) state_ = "ready";
      heartbeat_interval_ = absl::Milliseconds(
          std::max<int64_t>(10, response.heartbeat_interval_ms()));
      joins_->Increment();
      // A watch opened before this join may wait for a version this
      // coordinator never publishes: start it over.
      if (lost_at_epoch_ >= 0 && watch_context_ != nullptr) {
        watch_context_->TryCancel();
      }
      spdlog::info("job={} worker={} joined: plan_version={}", options_.job,
                   options_.worker_id, response.plan_version());
      return true;
    }
    // Permanent errors (a bad flag) would retry forever: say so, without
    // flooding the log while a coordinator restarts.
    if (failures++ % 10 == 0) {
      spdlog::warn("job={} worker={} join failed ({}): {}; retrying",
                   options_.job, options_.worker_id,
                   static_cast<int>(status.error_code()),
                   status.error_message());
    }
    stop_.WaitForNotificationWithTimeout(backoff.Next());
  }
  return false;
}

void WorkerAgent::LoseLease(const std::string& why) {
  spdlog::warn(
      "job={} worker={} lost its lease ({}); joining again, no step runs "
      "until the coordinator's current plan arrives",
      options_.job, options_.worker_id, why);
  absl::MutexLock lock(&mu_);
  state_ = "lost";
  if (lost_at_epoch_ < 0) lost_at_epoch_ = join_epoch_;
  lost_reason_ = why;
  job_spec_.reset();  // a job created again may have another spec
  if (watch_context_ != nullptr) watch_context_->TryCancel();
}

void WorkerAgent::MembershipLoop() {
  if (!JoinWithRetry()) return;
  int64_t unreachable = 0;  // heartbeats failed in a row, lease not lost
  while (true) {
    absl::Duration interval;
    int64_t known;
    {
      absl::MutexLock lock(&mu_);
      interval = heartbeat_interval_;
      // A stale plan's version would read as a lost lease again.
      known = plan_ && lost_at_epoch_ < 0 ? plan_->version() : 0;
    }
    if (stop_.WaitForNotificationWithTimeout(interval)) break;
    if (engine_ != nullptr) engine_->ReleaseTrainerIfGone();
    v1::HeartbeatRequest request;
    request.set_job(options_.job);
    request.set_worker_id(options_.worker_id);
    request.set_instance_id(instance_id_);
    request.set_plan_version(known);
    request.set_worker_token(options_.credentials->worker_token());
    // A trainer that asked within a few heartbeats counts: a standby's is
    // refused (it is not a rank) and asks again until it is one.
    request.set_has_trainer(
        engine_ != nullptr &&
        engine_->HasTrainer(std::max(interval * 3, absl::Seconds(1))));
    // Its rank: a job of replica groups groups the plan's ranks by it.
    if (request.has_trainer() && engine_->trainer_rank() >= 0) {
      request.set_trainer_rank(engine_->trainer_rank());
    }
    grpc::ClientContext context;
    context.set_deadline(Deadline(interval * 2));
    v1::HeartbeatResponse response;
    const grpc::Status status = stub_->Heartbeat(&context, request, &response);
    heartbeats_->Increment({status.ok() ? "ok" : "error"});
    if (status.ok()) {
      if (unreachable > 0) {
        spdlog::info("job={} worker={} coordinator reachable again",
                     options_.job, options_.worker_id);
      }
      unreachable = 0;
      FlushStepStats();
      if (response.draining() && !told_draining_) {
        told_draining_ = true;
        if (!draining_.load()) {
          spdlog::warn(
              "job={} worker={} the coordinator says this worker drains: "
              "handing its momentum over and leaving",
              options_.job, options_.worker_id);
          if (options_.on_drain_requested) options_.on_drain_requested();
        }
      }
    } else if (LeaseIsLost(status.error_code())) {
      unreachable = 0;
      LoseLease(absl::StrCat("heartbeat: ", status.error_message()));
      if (!JoinWithRetry()) return;
    } else if (unreachable++ % 10 == 0) {
      // Down or restarting: the lease (renewed by the coordinator when it
      // is back) is not lost; steps go on meanwhile.
      spdlog::warn("job={} worker={} heartbeat failed ({}): {}; retrying",
                   options_.job, options_.worker_id,
                   static_cast<int>(status.error_code()),
                   status.error_message());
    }
  }
  v1::LeaveJobRequest leave;
  leave.set_job(options_.job);
  leave.set_worker_id(options_.worker_id);
  leave.set_instance_id(instance_id_);
  leave.set_worker_token(options_.credentials->worker_token());
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(1)));
  v1::LeaveJobResponse response;
  const grpc::Status status = stub_->LeaveJob(&context, leave, &response);
  spdlog::info("job={} worker={} left: {}", options_.job, options_.worker_id,
               status.ok() ? "ok" : status.error_message());
}

absl::Status WorkerAgent::Drain(absl::Duration timeout,
                                const absl::Notification* cut_short) {
  const absl::Time deadline = absl::Now() + timeout;
  draining_.store(true);
  {
    absl::MutexLock lock(&mu_);
    state_ = "draining";
  }
  const std::string leaving = absl::StrCat(
      "worker \"", options_.worker_id, "\" is leaving job \"", options_.job,
      "\"; retry the step once the plan has a worker for this trainer");
  auto ended = [&] {
    return absl::Now() >= deadline ||
           (cut_short != nullptr && cut_short->HasBeenNotified());
  };
  // Nothing to hand over, or no step can run to carry it: leave now.
  const char* now = nullptr;
  bool persist_now = false;  // momentum held, and the trainer goes on
  if (engine_ == nullptr || engine_->last_step() < 0) {
    now = "no step committed here, no momentum to hand over";
  } else if (!options_.dedicated && !engine_->TrainerAlive()) {
    now = "its trainer is gone, so no step of the job can run";
  } else if (timeout <= absl::ZeroDuration()) {
    now = "--drain_timeout is 0";
    persist_now = true;
  }
  // Leaving with no step to carry the momentum to new owners while the
  // trainer goes on: what this worker holds goes to the job's checkpoint of
  // its last step (where the job keeps checkpoints), where its successor,
  // or the new owners, find it as they would a lost owner's. Not when the
  // trainer is gone: a restarted trainer resumes from a state of its own,
  // whose checkpoint a newer one must not displace.
  const auto persist_held = [&](const char* why) {
    const absl::StatusOr<int64_t> persisted = engine_->PersistHeldMomentum();
    if (persisted.ok()) {
      spdlog::info(
          "job={} worker={} {}: persisted the momentum of {} matrices as of "
          "step {} into the job's checkpoint",
          options_.job, options_.worker_id, why, *persisted,
          engine_->last_step());
    } else {
      spdlog::warn(
          "job={} worker={} {}: its momentum survives only in earlier "
          "checkpoints: {}",
          options_.job, options_.worker_id, why, persisted.status().ToString());
    }
  };
  if (now != nullptr) {
    if (engine_ != nullptr) engine_->StopStepping(leaving);
    spdlog::info("job={} worker={} leaves without draining: {}", options_.job,
                 options_.worker_id, now);
    if (persist_now) persist_held("leaving without draining");
    return absl::OkStatus();
  }
  // Ask, retrying while the coordinator is unreachable.
  int64_t version = -1;
  absl::Status refused = absl::DeadlineExceededError(absl::StrCat(
      "the coordinator at ", options_.coordinator,
      " did not answer the drain within ", absl::FormatDuration(timeout)));
  Backoff backoff;
  while (!ended()) {
    v1::LeaveJobRequest drain;
    drain.set_job(options_.job);
    drain.set_worker_id(options_.worker_id);
    drain.set_instance_id(instance_id_);
    drain.set_worker_token(options_.credentials->worker_token());
    drain.set_drain(true);
    grpc::ClientContext context;
    context.set_deadline(
        Deadline(std::max(std::min(absl::Seconds(5), deadline - absl::Now()),
                          absl::Milliseconds(1))));
    v1::LeaveJobResponse response;
    const grpc::Status status = stub_->LeaveJob(&context, drain, &response);
    if (status.ok()) {
      version = response.plan_version();
      break;
    }
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      refused = absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                             status.error_message());
      break;
    }
    absl::SleepFor(std::min(backoff.Next(), deadline - absl::Now()));
  }
  if (version < 0) {
    engine_->StopStepping(leaving);
    persist_held("leaving without draining");
    return refused;
  }
  spdlog::info(
      "job={} worker={} draining: owns nothing from plan_version={}; leaves "
      "once a step commits under it (at most {})",
      options_.job, options_.worker_id, version,
      absl::FormatDuration(deadline - absl::Now()));
  while (!ended() && engine_->last_step_plan_version() < version) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  engine_->StopStepping(leaving);
  if (engine_->last_step_plan_version() >= version) {
    spdlog::info(
        "job={} worker={} drained: step {} committed under plan_version={}, "
        "its momentum is with the new owners",
        options_.job, options_.worker_id, engine_->last_step(),
        engine_->last_step_plan_version());
    return absl::OkStatus();
  }
  // No step came to carry the handover (the trainers are idle): what this
  // worker holds goes to the job's checkpoint of its last step, where the
  // new owners find it as they would a lost owner's.
  const absl::StatusOr<int64_t> persisted = engine_->PersistHeldMomentum();
  if (persisted.ok()) {
    spdlog::warn(
        "job={} worker={} drain: no step committed under plan_version={} "
        "before it ended; persisted the momentum of {} matrices as of step "
        "{} into the job's checkpoint for their new owners",
        options_.job, options_.worker_id, version, *persisted,
        engine_->last_step());
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "no step committed under plan version ", version, " (last step ",
      engine_->last_step(), " under version ",
      engine_->last_step_plan_version(),
      ") before the drain ended, and its momentum could not be persisted: ",
      persisted.status().message()));
}

void WorkerAgent::WatchLoop() {
  Backoff backoff;
  while (!stop_.HasBeenNotified()) {
    grpc::ClientContext context;
    v1::WatchPlanRequest request;
    request.set_job(options_.job);
    request.set_worker_id(options_.worker_id);
    int64_t epoch = 0;
    {
      absl::MutexLock lock(&mu_);
      // A stale plan's version means nothing to the coordinator: ask for
      // its current plan, whatever its version.
      request.set_known_version(lost_at_epoch_ < 0 ? received_version_ : 0);
      epoch = join_epoch_;
      watch_context_ = &context;
    }
    if (stop_.HasBeenNotified()) context.TryCancel();
    std::unique_ptr<grpc::ClientReader<v1::Plan>> reader =
        stub_->WatchPlan(&context, request);
    v1::Plan plan;
    while (reader->Read(&plan)) {
      backoff.Reset();
      {
        absl::MutexLock lock(&mu_);
        // Opened before the re-join: the join cancels it and the next
        // stream brings the plan that holds this worker again.
        if (lost_at_epoch_ >= 0 && epoch <= lost_at_epoch_) continue;
      }
      int rank = -1;
      for (int i = 0; i < plan.workers_size(); ++i) {
        if (plan.workers(i) == options_.worker_id) rank = i;
      }
      spdlog::info("job={} worker={} plan_version={} rank={} ({})",
                   options_.job, options_.worker_id, plan.version(), rank,
                   plan.reason());
      // At once, not behind the delivery's calls and SetPlan's wait for the
      // step lock: a step waiting on a worker this plan dropped fails now,
      // naming it, instead of at the transport's timeout.
      if (engine_ != nullptr) engine_->AbortForPlan(MembershipFromProto(plan));
      {
        absl::MutexLock lock(&mu_);
        received_version_ = plan.version();
      }
      delivery_.Arrived(std::move(plan), epoch);
    }
    const grpc::Status status = reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      watch_context_ = nullptr;
    }
    if (stop_.HasBeenNotified()) break;
    spdlog::debug("watch ended ({}); reconnecting", status.error_message());
    stop_.WaitForNotificationWithTimeout(backoff.Next());
  }
}

void WorkerAgent::TakePlan(const v1::Plan& plan, int64_t epoch) {
  plan_version_->Set(static_cast<double>(plan.version()));
  absl::MutexLock lock(&mu_);
  plan_ = plan;
  if (lost_at_epoch_ >= 0 && join_epoch_ == epoch) {
    lost_at_epoch_ = -1;  // the coordinator's current plan: step again
    state_ = "ready";
    spdlog::info(
        "job={} worker={} follows the coordinator's plan_version={} again",
        options_.job, options_.worker_id, plan.version());
  }
}

absl::Status WorkerAgent::DeliverPlan(const v1::Plan& plan) {
  if (engine_ == nullptr) return absl::OkStatus();
  std::optional<v1::JobSpec> spec;
  {
    absl::MutexLock lock(&mu_);
    spec = job_spec_;
  }
  if (!spec) {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(10)));
    v1::GetJobRequest request;
    request.set_job(options_.job);
    v1::Job job;
    MUONPS_RETURN_IF_ERROR(FromGrpc(stub_->GetJob(&context, request, &job),
                                    "fetching the job's spec"));
    spec = job.spec();
    absl::MutexLock lock(&mu_);
    job_spec_ = spec;
  }
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(10)));
  v1::ListWorkersRequest request;
  request.set_job(options_.job);
  v1::ListWorkersResponse workers;
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(stub_->ListWorkers(&context, request, &workers),
               "listing the workers' data addresses"));
  std::map<std::string, std::string> addresses;
  for (const v1::WorkerInfo& w : workers.workers()) {
    addresses[w.worker_id()] = w.data_address();
  }
  MUONPS_ASSIGN_OR_RETURN(const JobPlan next, JobPlanFromProto(*spec, plan));
  MUONPS_RETURN_IF_ERROR(engine_->SetPlan(next, addresses));
  if (const absl::Status restored = engine_->RestoreMissingMomentum();
      !restored.ok()) {
    // The plan stands; a step names the matrices without momentum.
    spdlog::error(
        "job={} worker={} plan_version={} restoring momentum from "
        "checkpoints failed: {}",
        options_.job, options_.worker_id, plan.version(), restored.ToString());
  }
  return absl::OkStatus();
}

void WorkerAgent::FlushStepStats() {
  std::vector<StepResponse> pending;
  {
    absl::MutexLock lock(&mu_);
    pending.swap(pending_stats_);
  }
  for (const StepResponse& step : pending) {
    v1::ReportStepStatsRequest request;
    request.set_job(options_.job);
    request.set_worker_id(options_.worker_id);
    request.set_step(step.step_id);
    request.set_plan_version(step.plan_version);
    request.set_step_seconds(step.seconds);
    request.set_ns_seconds(step.ns_seconds);
    request.set_predicted_ns_seconds(step.predicted_ns_seconds);
    request.set_bytes_moved(step.bytes_moved);
    request.set_worker_token(options_.credentials->worker_token());
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(1)));
    v1::ReportStepStatsResponse response;
    (void)stub_->ReportStepStats(&context, request, &response);
  }
}

}  // namespace worker
}  // namespace muonps
