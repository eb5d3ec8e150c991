#include "server/worker/step_engine.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/trainer_segment.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"
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

void StepEngine::SetDataPlaneSecret(std::string secret) {
  // Not mu_: a step may hold it for the transport's timeout, and the agent
  // calls this from its heartbeat thread when it re-joins. A transport
  // built with another secret is rebuilt at the next step.
  absl::MutexLock lock(&secret_mu_);
  data_plane_secret_ = std::move(secret);
}

void StepEngine::DropTransport(const absl::Status& reason) {
  if (transport_ == nullptr) return;
  {
    // AbortForPlan may be aborting it: it is gone only after that.
    absl::MutexLock lock(&abort_mu_);
    published_transport_ = nullptr;
  }
  transport_->Abort(reason);
  transport_.reset();
}

absl::Status StepEngine::EnsureTransport() {
  std::string secret;
  {
    absl::MutexLock lock(&secret_mu_);
    secret = data_plane_secret_;
  }
  if (transport_ != nullptr && secret != transport_secret_) {
    DropTransport(absl::CancelledError(
        absl::StrCat("worker ", Quoted(worker_id_),
                     " got a new data-plane secret; reconnecting")));
  }
  // A newer plan dropped some of this one's workers: no step of it can
  // finish, so none starts (SetPlan brings the new one).
  if (const absl::Status replaced = PlanReplaced(); !replaced.ok()) {
    DropTransport(replaced);
    return replaced;
  }
  if (!handover_failed_.ok()) return handover_failed_;
  if (transport_ != nullptr) return absl::OkStatus();
  for (size_t r = 0; r < plan_.addresses.size(); ++r) {
    if (plan_.addresses[r].empty()) {
      return FieldError(absl::StatusCode::kUnavailable, "plan",
                        absl::StrCat("no data address for rank ", r));
    }
  }
  MUONPS_ASSIGN_OR_RETURN(
      transport_,
      make_transport_(plan_.rank, plan_.addresses,
                      static_cast<uint64_t>(plan_.version), secret));
  transport_secret_ = secret;
  if (transport_->memory() != device_.kind) {
    transport_.reset();
    return absl::InternalError(
        absl::StrCat("worker ", Quoted(worker_id_), " on ", DeviceName(device_),
                     " got a transport for the other kind of memory"));
  }
  {
    absl::MutexLock lock(&abort_mu_);
    published_transport_ = transport_.get();
  }
  // The plan may have been replaced while the transport was built.
  if (const absl::Status replaced = PlanReplaced(); !replaced.ok()) {
    DropTransport(replaced);
    return replaced;
  }
  return HandOver();
}

absl::Status StepEngine::HandOver() {
  HandoverContext context;
  context.plan = &plan_;
  context.previous = &previous_;
  context.transport = transport_.get();
  context.ops = backend_.ops.get();
  context.last_step = ledger_.last.load();
  context.first = handed_over_version_ != plan_.version;
  context.timeout = backend_.timeout;
  std::vector<std::pair<int, int64_t>> unresolved;
  context.unresolved = &unresolved;
  // The job's checkpoints, read once, when the first lost item asks.
  std::optional<absl::StatusOr<CheckpointCatalog>> catalog;
  context.checkpoint = [&](int matrix, int64_t expert, float* slot,
                           int64_t step) -> absl::Status {
    mu_.AssertHeld();
    const std::string& dir = plan_.job.checkpoint_dir();
    if (dir.empty() || step < 0) {
      return absl::NotFoundError("the job keeps no checkpoints");
    }
    // RestoreMissingMomentum already looked this item up for this step,
    // and no step was committed here since.
    const auto found = item_restores_.find({matrix, expert});
    if (found != item_restores_.end() && found->second.step == step &&
        found->second.committed == ledger_.last.load()) {
      const ItemSlot& held = plan_.slots[matrix][expert];
      if (!found->second.installed) {
        return absl::NotFoundError(found->second.why_not);
      }
      if (plan_.batches[held.batch].has_momentum[held.slot]) {
        return absl::OkStatus();  // the slot holds that step's momentum
      }
    }
    if (!catalog.has_value()) catalog = CheckpointCatalog::Load(dir);
    if (!catalog->ok()) return catalog->status();
    return MomentumFromCheckpoint(**catalog, matrix, expert, slot, step);
  };
  HandoverOutcome outcome;
  const absl::Status status = HandOverMomentum(context, &outcome);
  if (!status.ok() && !outcome.transport_ok) {
    const absl::Status failed =
        Annotate(ExplainReplaced(status, v1::StepRequest(), nullptr),
                 absl::StrCat("worker ", Quoted(worker_id_), " plan version ",
                              plan_.version));
    DropTransport(failed);
    return failed;
  }
  if (!context.first) return status;
  handed_over_version_ = plan_.version;
  if (!status.ok()) {
    handover_failed_ = status;
    lost_items_ = std::move(unresolved);
    spdlog::error("worker={} plan_version={} momentum handover: {}", worker_id_,
                  plan_.version, status.ToString());
    return status;
  }
  momentum_resets_ += outcome.reset;
  momentum_resets_total_ += outcome.reset;
  // Every item owned here now holds momentum as of the job's newest step
  // (handed over, or from a checkpoint of that step): what a restore on
  // start took from an older checkpoint is gone, and so is its rule that
  // the trainer resume from there.
  if (outcome.job_step >= 0) restore_unverified_ = -1;
  if (outcome.lost > 0) {
    spdlog::warn(
        "worker={} plan_version={} momentum handover: {} matrices lost their "
        "previous owner; here {} restored from the checkpoint, {} start from "
        "zero (allow_momentum_reset)",
        worker_id_, plan_.version, outcome.lost, outcome.restored,
        outcome.reset);
  }
  if (outcome.sent > 0 || outcome.received > 0) {
    spdlog::info(
        "worker={} plan_version={} momentum handover: sent {}, received {} "
        "matrices",
        worker_id_, plan_.version, outcome.sent, outcome.received);
  }
  return absl::OkStatus();
}

absl::Status StepEngine::MomentumFromCheckpoint(
    const CheckpointCatalog& catalog, int matrix, int64_t expert, float* slot,
    int64_t step) {
  const scheduler::MatrixSpec& spec = plan_.matrices[matrix];
  std::vector<float> values(spec.rows * spec.cols);
  MUONPS_ASSIGN_OR_RETURN(
      const int64_t as_of,
      catalog.Restore(spec.name, expert, spec.rows, spec.cols, values.data()));
  if (as_of != step) {
    if (restores_ != nullptr) restores_->Increment({"stale"}, 1);
    return absl::NotFoundError(absl::StrCat(
        "the newest checkpoint holding matrix ", Quoted(spec.name), " expert ",
        expert, " is of step ", as_of, "; the job is at step ", step));
  }
  kernels::DeviceOps& ops = *backend_.ops;
  MUONPS_RETURN_IF_ERROR(ops.Copy(
      slot, values.data(), static_cast<int64_t>(values.size()), ops.stream()));
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  if (restores_ != nullptr) restores_->Increment({"restored"}, 1);
  spdlog::info(
      "worker={} plan_version={} momentum of {} expert {} restored from the "
      "checkpoint of step {} (its owner left)",
      worker_id_, plan_.version, Quoted(spec.name), expert, step);
  return absl::OkStatus();
}

v1::StepResponse StepEngine::AlreadyApplied(int64_t step_id) const {
  v1::StepResponse out;
  out.set_step_id(step_id);
  out.set_plan_version(plan_.version);
  out.set_already_applied(true);
  return out;
}

absl::StatusOr<v1::StepResponse> StepEngine::Step(
    const v1::StepRequest& request, const StepCancelled& cancelled) {
  absl::MutexLock lock(&mu_);
  if (request.step_id() < 0) {
    return InvalidField("step_id", absl::StrCat(request.step_id(), " < 0"));
  }
  // Committed on every worker: nobody needs this round.
  if (request.step_id() <= ledger_.settled) {
    if (trainer_.has_value()) {
      MUONPS_RETURN_IF_ERROR(
          RedeliverMeans(ledger_, request.step_id(), *trainer_, *backend_.ops));
    }
    return AlreadyApplied(request.step_id());
  }
  if (plan_.rank < 0 || !trainer_.has_value()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "step_id",
                      plan_.rank < 0 ? "the worker is not in the current plan"
                                     : kNoTrainerAttached);
  }
  CheckRestoredStep(request.step_id());
  RoundResult round;
  for (int rounds = 0;; ++rounds) {
    if (rounds == kMaxRounds) {
      round.status = absl::AbortedError(
          absl::StrCat("step ", request.step_id(), ": after ", kMaxRounds,
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
      trainer_->buffers->SignalTrainer(ops.stream(), request.step_id());
  if (!round.status.ok()) return round.status;
  if (!signaled.ok()) return signaled;
  if (round.kind == RoundResult::Kind::kAlreadyApplied) {
    MUONPS_RETURN_IF_ERROR(
        RedeliverMeans(ledger_, request.step_id(), *trainer_, ops));
    return AlreadyApplied(request.step_id());
  }
  round.response.set_momentum_reset(momentum_resets_);
  momentum_resets_ = 0;
  return round.response;
}

absl::StatusOr<std::optional<v1::StepResponse>> StepEngine::FollowStep(
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
      v1::StepRequest request;  // the step id comes from rank 0
      RoundResult round = RunRound(request, /*trainer=*/nullptr, nullptr);
      MaybeCheckpoint();
      if (!round.status.ok()) return round.status;
      if (round.kind != RoundResult::Kind::kStepped) return std::nullopt;
      round.response.set_momentum_reset(momentum_resets_);
      momentum_resets_ = 0;
      return round.response;
    }
  }
  absl::SleepFor(wait);  // not a dedicated rank of a plan (yet)
  return std::nullopt;
}

RoundResult StepEngine::RunRound(const v1::StepRequest& request,
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
      absl::StrCat(
          "worker ", Quoted(worker_id_), ": step ",
          trainer == nullptr ? "" : absl::StrCat(request.step_id(), " "),
          "(plan version ", plan_.version, "; ranks ", ranks, ")"));
  return out;
}

}  // namespace worker
}  // namespace muonps
