// WorkerAgent's own side: its threads' start and stop, the dedicated
// worker's follow loop, the steps it queues for the coordinator, and what
// the local control service reads (Status, plan, CheckPlanCurrent). Its
// calls to the coordinator (join, heartbeats, the plan watch, step stats)
// are in worker_agent_coordinator.cc.
#include "server/worker/worker_agent.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

std::string RandomInstanceId() {
  std::random_device device;
  return absl::StrFormat("%08x%08x", device(), device());
}

}  // namespace

WorkerAgent::WorkerAgent(AgentOptions options, MetricsRegistry* metrics,
                         StepEngine* engine)
    : options_(std::move(options)),
      instance_id_(RandomInstanceId()),
      stub_(v1::Coordinator::NewStub(options_.coordinator_channel)),
      plan_version_(metrics->AddGauge("muonps_worker_plan_version",
                                      "Plan version the worker follows.")),
      heartbeats_(metrics->AddCounter("muonps_worker_heartbeats_total",
                                      "Heartbeats sent, by result.",
                                      {"result"})),
      joins_(metrics->AddCounter("muonps_worker_joins_total",
                                 "Successful joins (first and re-joins).")),
      momentum_resets_(metrics->AddCounter(
          "muonps_worker_momentum_resets_total",
          "Owned matrices (experts) that started from zero momentum: their "
          "owner changed and no momentum could be carried over.")),
      step_seconds_(metrics->AddGauge(
          "muonps_worker_step_seconds",
          "Wall time of the worker's part of its last step.")),
      step_compute_seconds_(metrics->AddGauge(
          "muonps_worker_step_compute_seconds",
          "How long the last step's owned stacks (momentum and "
          "Newton-Schulz) kept the compute stream busy; device time on a "
          "GPU.")),
      step_compute_predicted_seconds_(metrics->AddGauge(
          "muonps_worker_step_compute_predicted_seconds",
          "The plan's prediction of muonps_worker_step_compute_seconds (the "
          "workers' cost tables or the FLOP model).")),
      engine_(engine),
      delivery_(
          absl::StrCat("job=", options_.job, " worker=", options_.worker_id),
          [this](const v1::Plan& plan) { return DeliverPlan(plan); },
          [this](const v1::Plan& plan, int64_t epoch) {
            TakePlan(plan, epoch);
          }) {}

WorkerAgent::~WorkerAgent() { Stop(); }

void WorkerAgent::Start() {
  membership_thread_ = std::thread([this] { MembershipLoop(); });
  watch_thread_ = std::thread([this] { WatchLoop(); });
  if (options_.dedicated && engine_ != nullptr) {
    follow_thread_ = std::thread([this] { FollowLoop(); });
  }
}

void WorkerAgent::FollowLoop() {
  int64_t failures = 0, stepped = 0;
  while (!stop_.HasBeenNotified()) {
    if (!CheckPlanCurrent().ok()) {  // no step on a plan that may be gone
      stop_.WaitForNotificationWithTimeout(absl::Milliseconds(100));
      continue;
    }
    absl::StatusOr<std::optional<StepResponse>> step =
        engine_->FollowStep(absl::Seconds(1));
    if (!step.ok()) {
      // Expected while the trainers' workers have not connected yet, and
      // after a peer was lost until the next plan: say it, then retry.
      if (failures++ % 30 == 0) {
        spdlog::warn("job={} worker={} (dedicated) step: {}", options_.job,
                     options_.worker_id, step.status().ToString());
      }
      stop_.WaitForNotificationWithTimeout(absl::Milliseconds(200));
      continue;
    }
    failures = 0;
    if (step->has_value()) {
      if (stepped++ == 0) {
        spdlog::info("job={} worker={} (dedicated) first step {}", options_.job,
                     options_.worker_id, (*step)->step_id);
      }
      ReportStep(**step);
    } else {
      // Idle: FollowStep held the engine's lock for its whole wait. A gap
      // before taking it again lets a caller queued on it (GetMomentum, a
      // checkpoint, a new plan) in, rather than relying on the mutex to
      // hand it over; the next round's opening waits on the transport.
      stop_.WaitForNotificationWithTimeout(absl::Milliseconds(2));
    }
  }
}

void WorkerAgent::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  {
    absl::MutexLock lock(&mu_);
    if (watch_context_ != nullptr) watch_context_->TryCancel();
  }
  if (membership_thread_.joinable()) membership_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
  delivery_.Stop();
  if (follow_thread_.joinable()) follow_thread_.join();
}

absl::Status WorkerAgent::CheckPlanCurrent() const {
  const std::optional<PlanDelivery::Refusal> refused = delivery_.Refused();
  absl::MutexLock lock(&mu_);
  if (lost_at_epoch_ < 0 && refused.has_value()) {
    return absl::UnavailableError(absl::StrCat(
        "worker \"", options_.worker_id, "\" of job \"", options_.job,
        "\" has not taken plan version ", refused->version,
        " yet (it retries): ", refused->why.message(), "; retry the step"));
  }
  if (lost_at_epoch_ < 0) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "worker \"", options_.worker_id, "\" lost its lease in job \"",
      options_.job, "\" (", lost_reason_,
      ") and is joining again: its plan may no longer be the coordinator's; "
      "retry the step"));
}

void WorkerAgent::ReportStep(const StepResponse& step) {
  const int64_t resets =
      engine_ != nullptr ? engine_->momentum_resets_total() : 0;
  step_seconds_->Set(step.seconds);
  step_compute_seconds_->Set(step.ns_seconds);
  step_compute_predicted_seconds_->Set(step.predicted_ns_seconds);
  absl::MutexLock lock(&mu_);
  if (pending_stats_.size() < 1000) pending_stats_.push_back(step);
  // The momentum handover resets before the plan version's first step.
  if (resets > resets_counted_) {
    momentum_resets_->Increment({},
                                static_cast<double>(resets - resets_counted_));
    spdlog::warn(
        "job={} worker={} plan_version={} {} owned matrices started from "
        "zero momentum: their previous owner left the job "
        "(allow_momentum_reset)",
        options_.job, options_.worker_id, step.plan_version,
        resets - resets_counted_);
    resets_counted_ = resets;
  }
}

v1::WorkerStatus WorkerAgent::Status() const {
  // Read before taking mu_, which the heartbeat loop needs: never hold it
  // while anything else may wait.
  const int64_t last_step = engine_ != nullptr ? engine_->last_step() : -1;
  const int64_t checkpointed =
      engine_ != nullptr ? engine_->last_checkpoint_step() : -1;
  const int64_t restored = engine_ != nullptr ? engine_->restored_step() : -1;
  const std::optional<PlanDelivery::Refusal> refused = delivery_.Refused();
  absl::MutexLock lock(&mu_);
  v1::WorkerStatus out;
  out.set_worker_id(options_.worker_id);
  out.set_job(options_.job);
  out.set_coordinator(options_.coordinator);
  out.set_state(refused.has_value() && state_ == "ready" ? "behind" : state_);
  if (refused.has_value()) {
    out.set_plan_error(absl::StrCat("plan version ", refused->version, ": ",
                                    refused->why.message()));
  }
  out.set_rank(-1);
  out.set_last_step(last_step);
  out.set_last_checkpoint_step(checkpointed);
  out.set_restored_step(restored);
  if (!plan_) return out;
  out.set_plan_version(plan_->version());
  for (int i = 0; i < plan_->workers_size(); ++i) {
    if (plan_->workers(i) == options_.worker_id) out.set_rank(i);
  }
  for (const v1::MatrixPlacement& m : plan_->matrices()) {
    for (const std::string& owner : m.owners()) {
      if (owner == options_.worker_id)
        out.set_owned_matrices(out.owned_matrices() + 1);
    }
  }
  for (const v1::WorkerLoad& load : plan_->loads()) {
    if (load.worker_id() == options_.worker_id) {
      out.set_owned_momentum_bytes(load.momentum_bytes());
    }
  }
  return out;
}

std::optional<v1::Plan> WorkerAgent::plan() const {
  absl::MutexLock lock(&mu_);
  return plan_;
}

}  // namespace worker
}  // namespace muonps
