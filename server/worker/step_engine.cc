// StepEngine: its lifetime, the attached trainer's release, and the steps
// (Step, FollowStep, one round). Its other parts: step_engine_setup.cc (a
// new plan version), step_engine_attach.cc (a trainer's buffers),
// step_engine_transport.cc (the transport, its momentum handover, and a
// replaced plan's errors) and step_engine_momentum.cc (the MomentumStore's
// calls, ordered with the steps).
#include "server/worker/step_engine.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "lending/trainer_segment.h"
#include "server/worker/step_control.h"
#include "server/worker/step_protocol.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// Rounds one Step call may take: a retry settles an older step in one, the
// step its peers' trainers come back with runs in the next.
constexpr int kMaxRounds = 4;

uint64_t RandomInstance() {
  std::random_device random;
  return (static_cast<uint64_t>(random()) << 32) ^ random();
}

}  // namespace

StepEngine::StepEngine(std::string worker_id, StepBackend backend,
                       TransportFactory make_transport)
    : worker_id_(std::move(worker_id)),
      device_(backend.ops->device()),
      ops_(backend.ops.get()),
      backend_(std::move(backend)),
      momentum_(worker_id_, ops_),
      transport_(worker_id_, device_, std::move(make_transport)),
      ledger_(RandomInstance()) {}

StepEngine::~StepEngine() {
  absl::MutexLock lock(&mu_);
  // The transport goes before the buffers its pending work may touch.
  transport_.Drop(absl::CancelledError("the worker is shutting down"));
  trainer_.reset();
}

int64_t StepEngine::last_step() const { return ledger_.last.load(); }

void StepEngine::set_step_hook(StepHook hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

bool StepEngine::ReleaseTrainerIfGone() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const int64_t pid = trainer_pid_.load();
  if (pid <= 0 || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) {
    return false;
  }
  if (!mu_.TryLock()) return false;  // a step runs: a later call retries
  bool released = false;
  if (trainer_.has_value() && trainer_pid_.load() == pid) {
    transport_.Drop(absl::CancelledError(
        absl::StrCat("trainer process ", pid, " is gone")));
    DropStaged(ledger_, plan_);  // its memory went with it
    trainer_.reset();
    trainer_pid_.store(0);
    released = true;
  }
  mu_.Unlock();
  if (released) {
    spdlog::warn("worker={} trainer process {} is gone: released its buffers",
                 worker_id_, pid);
  }
  return released;
}

absl::Status StepEngine::NoPlanYet() const {
  return FieldError(absl::StatusCode::kFailedPrecondition, "plan",
                    absl::StrCat("worker ", Quoted(worker_id_),
                                 " has no plan yet (or is not in it)"));
}

StepResponse StepEngine::AlreadyApplied(int64_t step_id) const {
  StepResponse out;
  out.step_id = step_id;
  out.plan_version = plan_.version;
  out.already_applied = true;
  return out;
}

absl::StatusOr<StepResponse> StepEngine::Step(const StepRequest& request,
                                              const StepCancelled& cancelled) {
  std::optional<CheckpointSnapshot> snapshot;
  absl::StatusOr<StepResponse> out;
  {
    absl::MutexLock lock(&mu_);
    out = StepLocked(request, cancelled, &snapshot);
  }
  // Outside the lock: the writer may wait for the previous checkpoint.
  if (snapshot.has_value()) momentum_.Submit(std::move(*snapshot));
  return out;
}

absl::StatusOr<StepResponse> StepEngine::StepLocked(
    const StepRequest& request, const StepCancelled& cancelled,
    std::optional<CheckpointSnapshot>* snapshot) {
  if (request.step_id < 0) {
    return InvalidField("step_id", absl::StrCat(request.step_id, " < 0"));
  }
  // Committed on every worker: nobody needs this round.
  if (request.step_id <= ledger_.settled) {
    if (trainer_.has_value()) {
      MUONPS_RETURN_IF_ERROR(
          RedeliverMeans(ledger_, request.step_id, *trainer_, *backend_.ops));
    }
    return AlreadyApplied(request.step_id);
  }
  if (plan_.rank < 0 || !trainer_.has_value()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "step_id",
                      plan_.rank < 0 ? "the worker is not in the current plan"
                                     : kNoTrainerAttached);
  }
  momentum_.CheckRestoredStep(request.step_id, ledger_.last.load());
  RoundResult round;
  for (int rounds = 0;; ++rounds) {
    if (rounds == kMaxRounds) {
      round.status = absl::AbortedError(
          absl::StrCat("step ", request.step_id, ": after ", kMaxRounds,
                       " rounds the trainers still ask for different steps"));
      break;
    }
    round.status = EnsureTransport();
    if (!round.status.ok()) break;
    round = RunRound(request, &*trainer_, cancelled);
    if (!round.status.ok() || round.kind != RoundResult::Kind::kAgain) break;
  }
  *snapshot = momentum_.TakeSnapshot(ledger_.last.load());
  // The trainer's stream waits for this (CUDA), whatever happened.
  kernels::DeviceOps& ops = *backend_.ops;
  const absl::Status signaled =
      trainer_->buffers->SignalTrainer(ops.stream(), request.step_id);
  if (!round.status.ok()) return round.status;
  if (!signaled.ok()) return signaled;
  if (round.kind == RoundResult::Kind::kAlreadyApplied) {
    MUONPS_RETURN_IF_ERROR(
        RedeliverMeans(ledger_, request.step_id, *trainer_, ops));
    return AlreadyApplied(request.step_id);
  }
  round.response.momentum_reset = momentum_.TakeResets();
  return round.response;
}

absl::StatusOr<std::optional<StepResponse>> StepEngine::FollowStep(
    absl::Duration wait) {
  std::optional<CheckpointSnapshot> snapshot;
  absl::StatusOr<std::optional<StepResponse>> out = std::nullopt;
  bool dedicated = false;
  {
    absl::MutexLock lock(&mu_);
    const int size = static_cast<int>(plan_.ownership.worker_ids.size());
    dedicated =
        plan_.rank >= 0 && plan_.rank >= size - plan_.ownership.dedicated;
    if (dedicated) out = FollowLocked(wait, &snapshot);
  }
  if (snapshot.has_value()) momentum_.Submit(std::move(*snapshot));
  if (!dedicated) absl::SleepFor(wait);  // not a dedicated rank of a plan
  return out;
}

absl::StatusOr<std::optional<StepResponse>> StepEngine::FollowLocked(
    absl::Duration wait, std::optional<CheckpointSnapshot>* snapshot) {
  MUONPS_RETURN_IF_ERROR(EnsureTransport());
  // Rank 0 has a trainer; its first message opens every round: a
  // RoundOpening, which travels as fp32 elements (ControlChannel).
  const absl::Status opened = transport_.get()->AwaitFrom(
      0, ControlChannel::FloatsOf<RoundOpening>(), DType::kFloat32, wait);
  if (absl::IsDeadlineExceeded(opened)) return std::nullopt;
  if (!opened.ok()) {
    transport_.Drop(opened);
    return opened;
  }
  StepRequest request;  // the step id comes from rank 0
  RoundResult round = RunRound(request, /*trainer=*/nullptr, nullptr);
  *snapshot = momentum_.TakeSnapshot(ledger_.last.load());
  if (!round.status.ok()) return round.status;
  if (round.kind != RoundResult::Kind::kStepped) return std::nullopt;
  round.response.momentum_reset = momentum_.TakeResets();
  return round.response;
}

RoundResult StepEngine::RunRound(const StepRequest& request,
                                 const AttachedTrainer* trainer,
                                 const StepCancelled& cancelled) {
  StepContext context;
  context.plan = &plan_;
  context.trainer = trainer;
  context.transport = transport_.get();
  context.ops = backend_.ops.get();
  context.kernels = backend_.kernels.get();
  context.ledger = &ledger_;
  context.timeout = backend_.timeout;
  context.cancelled = cancelled;
  context.hook = hook_;
  StepRun run(context);
  RoundResult out = run.Run(request);
  if (out.status.ok() || out.transport_ok) return out;
  out.status = ExplainReplaced(out.status, request, trainer);
  transport_.Drop(out.status);
  // Transport errors name peer ranks: say whose they are.
  std::string ranks;
  for (size_t r = 0; r < plan_.ownership.worker_ids.size(); ++r) {
    absl::StrAppend(&ranks, r == 0 ? "" : ", ", r, " = ",
                    Quoted(plan_.ownership.worker_ids[r]));
  }
  out.status = Annotate(
      out.status,
      absl::StrCat("worker ", Quoted(worker_id_), ": step ",
                   trainer == nullptr ? "" : absl::StrCat(request.step_id, " "),
                   "(plan version ", plan_.version, "; ranks ", ranks, ")"));
  return out;
}

}  // namespace worker
}  // namespace muonps
