// StepEngine: its lifetime, the attached trainer's release, the owned
// momentum's reads and writes (GetMomentum, SetMomentum), and the steps
// (Step, FollowStep, one round). Its other parts: step_engine_setup.cc (a
// new plan version), step_engine_attach.cc (a trainer's buffers),
// step_engine_transport.cc (the transport and the momentum handover),
// step_engine_plan_change.cc (AbortForPlan) and step_engine_checkpoint.cc.
#include "server/worker/step_engine.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "lending/trainer_segment.h"
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

StepBackend CpuStepBackend(absl::Duration timeout) {
  StepBackend backend;
  backend.kernels =
      std::make_unique<kernels::CpuKernels>(kernels::CpuKernelOptions{});
  backend.ops = std::make_unique<kernels::CpuDeviceOps>();
  backend.open_buffers = OpenSharedMemoryBuffers;
  backend.timeout = timeout;
  return backend;
}

StepEngine::StepEngine(std::string worker_id, StepBackend backend,
                       TransportFactory make_transport)
    : worker_id_(std::move(worker_id)),
      make_transport_(std::move(make_transport)),
      device_(backend.ops->device()),
      backend_(std::move(backend)),
      ledger_(RandomInstance()) {}

StepEngine::~StepEngine() {
  absl::MutexLock lock(&mu_);
  // The transport goes before the buffers its pending work may touch.
  DropTransport(absl::CancelledError("the worker is shutting down"));
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
    DropTransport(absl::CancelledError(
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

absl::StatusOr<ItemSlot> StepEngine::OwnedSlot(const std::string& matrix,
                                               int64_t expert) const {
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    if (plan_.matrices[m].name != matrix) continue;
    if (expert >= 0 && expert < plan_.matrices[m].experts &&
        plan_.slots[m][expert].batch >= 0) {
      return plan_.slots[m][expert];
    }
    return FieldError(
        absl::StatusCode::kNotFound, "matrix",
        absl::StrCat(Quoted(matrix), " expert ", expert,
                     " is not owned by worker ", Quoted(worker_id_)));
  }
  return FieldError(absl::StatusCode::kNotFound, "matrix",
                    absl::StrCat(Quoted(matrix), " is not in the job"));
}

absl::StatusOr<std::vector<float>> StepEngine::Momentum(
    const std::string& matrix, int64_t expert) const {
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(const ItemSlot slot, OwnedSlot(matrix, expert));
  const ComputeBatch& batch = plan_.batches[slot.batch];
  if (!batch.has_momentum[slot.slot]) {
    return FieldError(
        absl::StatusCode::kNotFound, "matrix",
        absl::StrCat(Quoted(matrix), " expert ", expert,
                     " has no momentum on worker ", Quoted(worker_id_)));
  }
  std::vector<float> out(batch.rows * batch.cols);
  kernels::DeviceOps& ops = *backend_.ops;
  MUONPS_RETURN_IF_ERROR(ops.Copy(out.data(), plan_.SlotData(slot, true),
                                  static_cast<int64_t>(out.size()),
                                  ops.stream()));
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  return out;
}

absl::Status StepEngine::SetMomentum(const std::string& matrix, int64_t expert,
                                     std::vector<float> values) {
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(const ItemSlot slot, OwnedSlot(matrix, expert));
  ComputeBatch& batch = plan_.batches[slot.batch];
  if (static_cast<int64_t>(values.size()) != batch.rows * batch.cols) {
    return InvalidField("values",
                        absl::StrCat(values.size(), " floats; the matrix has ",
                                     batch.rows * batch.cols));
  }
  for (float v : values) {
    if (!std::isfinite(v)) return InvalidField("values", "non-finite");
  }
  if (ledger_.staged.step_id >= 0) {
    spdlog::warn(
        "worker={} step={} staged in doubt: dropped, momentum is "
        "being restored",
        worker_id_, ledger_.staged.step_id);
    DropStaged(ledger_, plan_);
  }
  kernels::DeviceOps& ops = *backend_.ops;
  MUONPS_RETURN_IF_ERROR(ops.Copy(plan_.SlotData(slot, true), values.data(),
                                  static_cast<int64_t>(values.size()),
                                  ops.stream()));
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  batch.has_momentum[slot.slot] = true;
  const scheduler::ItemRef item = batch.items[slot.slot];
  lost_items_.erase(
      std::remove(lost_items_.begin(), lost_items_.end(),
                  std::make_pair(static_cast<int>(item.matrix), expert)),
      lost_items_.end());
  return absl::OkStatus();
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
  absl::MutexLock lock(&mu_);
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
  CheckRestoredStep(request.step_id);
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
  MaybeCheckpoint();
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
  round.response.momentum_reset = momentum_resets_;
  momentum_resets_ = 0;
  return round.response;
}

absl::StatusOr<std::optional<StepResponse>> StepEngine::FollowStep(
    absl::Duration wait) {
  {
    absl::MutexLock lock(&mu_);
    const int size = static_cast<int>(plan_.ownership.worker_ids.size());
    if (plan_.rank >= 0 && plan_.rank >= size - plan_.ownership.dedicated) {
      MUONPS_RETURN_IF_ERROR(EnsureTransport());
      // Rank 0 has a trainer; its first message opens every round.
      const absl::Status opened =
          transport_->AwaitFrom(0, sizeof(RoundOpening), wait);
      if (absl::IsDeadlineExceeded(opened)) return std::nullopt;
      if (!opened.ok()) {
        DropTransport(opened);
        return opened;
      }
      StepRequest request;  // the step id comes from rank 0
      RoundResult round = RunRound(request, /*trainer=*/nullptr, nullptr);
      MaybeCheckpoint();
      if (!round.status.ok()) return round.status;
      if (round.kind != RoundResult::Kind::kStepped) return std::nullopt;
      round.response.momentum_reset = momentum_resets_;
      momentum_resets_ = 0;
      return round.response;
    }
  }
  absl::SleepFor(wait);  // not a dedicated rank of a plan (yet)
  return std::nullopt;
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
  DropTransport(out.status);
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
