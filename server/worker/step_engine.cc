// StepEngine: its lifetime, a new plan version (schedule and stacks made
// before the engine's lock, installed under it with the momentum), a
// trainer's attachment (bindings checked and buffers mapped outside the
// lock), the transport and its momentum handover, the steps (Step,
// FollowStep, one round) and the MomentumStore's calls that use the device,
// ordered with the steps.
#include "server/worker/step_engine.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "lending/trainer_segment.h"
#include "scheduler/node_exchange.h"
#include "server/worker/step_control.h"
#include "server/worker/step_protocol.h"
#include "server/worker/trainer_binding.h"
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
      update_dtype_(backend.kernels->update_dtype()),
      io_timeout_(backend.timeout),
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

int64_t StepEngine::last_step_plan_version() const {
  return ledger_.last_version.load();
}

int64_t StepEngine::LoadCheckpointedMeans(const AttachedTrainer& trainer,
                                          int64_t step,
                                          kernels::DeviceOps& ops) {
  absl::StatusOr<MomentumStore::StagedMeans> means =
      momentum_.ReadStagedMeans(step);
  absl::Status loaded = means.status();
  for (size_t k = 0; loaded.ok() && k < trainer.unreduced.size(); ++k) {
    const auto& [name, b] = trainer.adamw[trainer.unreduced[k]];
    auto it = means->find(name);
    if (it == means->end() ||
        static_cast<int64_t>(it->second.size()) != b.elements) {
      loaded = absl::NotFoundError(
          absl::StrCat("no means of ", Quoted(name), " of its size"));
      break;
    }
    loaded = ops.Copy(trainer.means->data() + b.staged_at, it->second.data(),
                      b.elements, ops.stream());
  }
  if (loaded.ok()) loaded = ops.Synchronize(ops.stream());
  if (!loaded.ok()) {
    spdlog::info(
        "worker={} step {}'s AdamW means are not in its checkpoint ({}): a "
        "peer sends them if its trainer retries the step",
        worker_id_, step, std::string(loaded.message()));
    return -1;
  }
  spdlog::info("worker={} step {}'s AdamW means read from its checkpoint",
               worker_id_, step);
  return step;
}

absl::StatusOr<int64_t> StepEngine::PersistHeldMomentum() {
  // No step runs once stopped: the ledger's last step stays put.
  const int64_t last = ledger_.last.load();
  if (last < 0) return 0;
  return momentum_.PersistHeld(last);
}

void StepEngine::StopStepping(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (!stopped_.has_value()) stopped_ = why;
}

void StepEngine::set_step_hook(StepHook hook) {
  absl::MutexLock lock(&mu_);
  hook_ = std::move(hook);
}

bool StepEngine::TrainerAlive() const {
  const int64_t pid = trainer_pid_.load();
  return pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH);
}

bool StepEngine::HasTrainer(absl::Duration recent) const {
  const int64_t asked = trainer_asked_ms_.load();
  return trainer_pid_.load() > 0 ||
         (asked > 0 && absl::ToUnixMillis(absl::Now()) - asked <=
                           absl::ToInt64Milliseconds(recent));
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

absl::Status StepEngine::FollowsReplicaGroups(int trainer_rank) const {
  const int replicas = plan_.job.replicas;
  if (replicas <= 1) return absl::OkStatus();
  const int shards = plan_.trainers() / replicas;
  if (plan_.groups.count() == replicas && shards > 0 &&
      plan_.groups.group_of(plan_.rank) == trainer_rank / shards) {
    return absl::OkStatus();
  }
  // The client retries: the trainer's rank this call named reaches the
  // coordinator with the next heartbeat, and once every rank's has, the
  // plan it makes does.
  return FieldError(
      absl::StatusCode::kFailedPrecondition, "plan",
      absl::StrCat("plan version ", plan_.version,
                   " does not follow the job's ", replicas,
                   " replica groups (JobSpec.replicas) yet: the coordinator "
                   "makes one once every worker's heartbeat names its "
                   "trainer; retry"));
}

absl::Status StepEngine::NoPlanYet() const {
  if (plan_.version <= 0) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan",
        absl::StrCat("worker ", Quoted(worker_id_), " has no plan yet"));
  }
  return FieldError(
      absl::StatusCode::kFailedPrecondition, "plan",
      absl::StrCat("worker ", Quoted(worker_id_),
                   " is not a rank of plan version ", plan_.version,
                   ": it is joining or leaving, or a standby beyond the "
                   "job's trainers until the coordinator ranks it for this "
                   "trainer"));
}

void StepEngine::AdoptRecordLocked(const StepRecord& record) {
  if (ledger_.last.load() >= 0 || record.applied < 0) return;
  ledger_.last.store(record.applied);
  momentum_.AdoptCommitted(record.applied);
  spdlog::info(
      "worker={} its trainer's step record says the parameters hold step "
      "{}{}: taken as this worker's last committed step",
      worker_id_, record.applied,
      record.torn() >= 0
          ? absl::StrCat(" and part of step ", record.torn(),
                         " (its predecessor stopped writing them)")
          : "");
}

void StepEngine::TakeResumeLocked(int64_t resumed_after) {
  const int64_t last = ledger_.last.load();
  if (last < 0) {
    // Nothing committed since this worker started: as a step record
    // would say it.
    StepRecord said;
    said.applied = resumed_after;
    said.applying = resumed_after;
    AdoptRecordLocked(said);
    return;
  }
  // A step committed since the trainer attached went into these
  // parameters (a retry whose first attempt stepped): they hold `last`.
  if (last > ledger_.last_at_attach || resumed_after >= last) return;
  if (ledger_.trainer_behind != resumed_after) {
    spdlog::warn(
        "worker={} its trainer resumed from its state after step {}, and "
        "this worker committed through step {}: the parameters are repaired "
        "from a peer's trainer, or the step is refused",
        worker_id_, resumed_after, last);
  }
  ledger_.trainer_behind = resumed_after;
}

StepResponse StepEngine::AlreadyApplied(int64_t step_id) const {
  StepResponse out;
  out.step_id = step_id;
  out.plan_version = plan_.version;
  out.already_applied = true;
  out.last_step = ledger_.last.load();
  return out;
}

absl::StatusOr<StepResponse> StepEngine::Step(const StepRequest& request,
                                              const StepCancelled& cancelled) {
  // A plan that arrived is installed first (SetPlan takes mu_), so the step
  // runs on it rather than dialling the version it replaces.
  transport_.AwaitPublished(io_timeout_);
  absl::MutexLock lock(&mu_);
  return StepLocked(request, cancelled);
}

absl::StatusOr<StepResponse> StepEngine::StepLocked(
    const StepRequest& request, const StepCancelled& cancelled) {
  if (stopped_.has_value()) return absl::UnavailableError(*stopped_);
  if (request.step_id < 0) {
    return InvalidField("step_id", absl::StrCat(request.step_id, " < 0"));
  }
  if (request.resumed_after.has_value() &&
      (*request.resumed_after < -1 ||
       *request.resumed_after >= request.step_id)) {
    return InvalidField(
        "resumed_after",
        absl::StrCat(*request.resumed_after, " is not in [-1, step_id ",
                     request.step_id, ")"));
  }
  if (request.resumed_after.has_value() && trainer_.has_value()) {
    TakeResumeLocked(*request.resumed_after);
  }
  // Committed on every worker: nobody needs this round, unless the
  // trainer's parameters miss the step (a repair needs the peers).
  if (request.step_id <= ledger_.settled &&
      request.step_id <= ledger_.params_step()) {
    if (trainer_.has_value()) {
      MUONPS_RETURN_IF_ERROR(
          RedeliverMeans(ledger_, request.step_id, *trainer_, *backend_.ops));
    }
    return AlreadyApplied(request.step_id);
  }
  if (plan_.rank < 0) {
    // A trainer steps here: the heartbeat says so (a standby's trainer
    // gets its worker ranked).
    trainer_asked_ms_.store(absl::ToUnixMillis(absl::Now()));
    // A restarted worker sees the plan that dropped it before the one that
    // takes it back; a leaving one, the plan without it; a standby, plans
    // that rank the job's trainers' other workers.
    return absl::UnavailableError(absl::StrCat(
        "worker ", Quoted(worker_id_), " is not in plan version ",
        plan_.version, ": it is joining or leaving the job; retry the step"));
  }
  if (!trainer_.has_value()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "step_id",
                      kNoTrainerAttached);
  }
  // Before anything reads a gradient (a stack computed ahead included).
  MUONPS_RETURN_IF_ERROR(trainer_->PlaceGradients(request.gradients));
  // Room to put back what a step applies early among several workers
  // (EarlyApply::kUndoable), once a step may; without it, their steps apply
  // at the commit.
  if (plan_.ownership.worker_ids.size() > 1 && trainer_->kept == nullptr &&
      !trainer_->kept_refused && MayApplyEarly() &&
      StepMayApplyEarly(request.step_id)) {
    const absl::Status kept = trainer_->AllocateKept(*backend_.ops);
    if (!kept.ok()) {
      trainer_->kept_refused = true;
      spdlog::warn(
          "worker {}: steps apply their updates at the commit, not as they "
          "land: {}",
          worker_id_, kept.ToString());
    }
  }
  RoundResult round;
  for (int rounds = 0;; ++rounds) {
    if (rounds == kMaxRounds) {
      round.status = absl::AbortedError(
          absl::StrCat("step ", request.step_id, ": after ", kMaxRounds,
                       " rounds the trainers still ask for different steps"));
      break;
    }
    round.status = EnsureTransport();
    if (!round.status.ok()) {
      round.status = WithTornParameters(round.status);
      break;
    }
    round = RunRound(request, &*trainer_, cancelled);
    // The parameters hold the committed step whole now: what the worker
    // before this one left written part-way is gone from them.
    if (round.repaired) {
      trainer_->inherited.applying = trainer_->inherited.applied;
    }
    if (!round.status.ok() || round.kind != RoundResult::Kind::kAgain) break;
  }
  kernels::DeviceOps& ops = *backend_.ops;
  // The step's AdamW means again, before the trainer's stream goes on to
  // step AdamW on them.
  absl::Status redelivered;
  if (round.status.ok() && round.kind == RoundResult::Kind::kAlreadyApplied) {
    redelivered = RedeliverMeans(ledger_, request.step_id, *trainer_, ops);
  }
  // The trainer's stream waits for this (CUDA), whatever happened (a step
  // this round committed signalled it already, after its writes).
  const absl::Status signaled =
      trainer_->buffers->SignalTrainer(ops.stream(), request.step_id);
  if (!round.status.ok()) return round.status;
  MUONPS_RETURN_IF_ERROR(redelivered);
  if (!signaled.ok()) return signaled;
  if (round.kind == RoundResult::Kind::kAlreadyApplied) {
    StepResponse applied = AlreadyApplied(request.step_id);
    applied.repaired = round.repaired;
    return applied;
  }
  round.response.momentum_reset = momentum_.TakeResets();
  return round.response;
}

absl::StatusOr<std::optional<StepResponse>> StepEngine::FollowStep(
    absl::Duration wait) {
  absl::StatusOr<std::optional<StepResponse>> out = std::nullopt;
  bool dedicated = false;
  transport_.AwaitPublished(io_timeout_);
  {
    absl::MutexLock lock(&mu_);
    const int size = static_cast<int>(plan_.ownership.worker_ids.size());
    dedicated = !stopped_.has_value() && plan_.rank >= 0 &&
                plan_.rank >= size - plan_.ownership.dedicated;
    if (dedicated) out = FollowLocked(wait);
  }
  if (!dedicated) absl::SleepFor(wait);  // not a dedicated rank of a plan
  return out;
}

absl::StatusOr<std::optional<StepResponse>> StepEngine::FollowLocked(
    absl::Duration wait) {
  MUONPS_RETURN_IF_ERROR(EnsureTransport());
  // The first message from this rank's parent in the control tree opens
  // every round: a RoundOpening, which travels as fp32 elements
  // (ControlChannel, RoundAgreement::OpenRound).
  transport::Transport* const t = transport_.get();
  const absl::Status opened = t->AwaitFrom(
      t->control()->tree().Parent(t->rank()),
      ControlChannel::FloatsOf<RoundOpening>(), DType::kFloat32, wait);
  if (absl::IsDeadlineExceeded(opened)) return std::nullopt;
  if (!opened.ok()) {
    transport_.Drop(opened);
    return opened;
  }
  StepRequest request;  // the step id comes from rank 0
  RoundResult round = RunRound(request, /*trainer=*/nullptr, nullptr);
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
  context.persist = [this, trainer, ops = context.ops](int64_t step_id) {
    // The means go to the checkpoint with the momentum: a worker killed
    // with its peers within the step redelivers them from there.
    return momentum_.PersistStaged(
        step_id,
        [trainer, ops]() -> absl::StatusOr<MomentumStore::StagedMeans> {
          MomentumStore::StagedMeans means;
          if (trainer == nullptr) return means;
          for (const int i : trainer->unreduced) {
            const auto& [name, b] = trainer->adamw[i];
            std::vector<float>& values = means[name];
            values.resize(b.elements);
            MUONPS_RETURN_IF_ERROR(
                ops->Copy(values.data(), trainer->means->data() + b.staged_at,
                          b.elements, ops->stream()));
          }
          MUONPS_RETURN_IF_ERROR(ops->Synchronize(ops->stream()));
          return means;
        });
  };
  context.apply_early = [this, may = MayApplyEarly()](int64_t step_id) {
    return may && StepMayApplyEarly(step_id);
  };
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

bool StepEngine::MayApplyEarly() const {
  // With owner groups a kill part-way loses no momentum (every group holds
  // a copy), so it must lose no parameters either: a peer's trainer sends
  // the committed step's (RoundKind::kRepair), where trainers keep the
  // whole of every matrix.
  const bool repairable = plan_.groups.count() <= 1 ||
                          (trainer_.has_value() && trainer_->full_params);
  switch (backend_.apply_early) {
    case EarlyApplyPolicy::kNever:
      return false;
    case EarlyApplyPolicy::kAlways:
      return repairable;
    case EarlyApplyPolicy::kAsPlanned:
      return repairable && !plan_.job.apply_at_commit;
  }
  return false;
}

bool StepEngine::StepMayApplyEarly(int64_t step_id) const {
  return !momentum_.CheckpointDue(step_id) &&
         !momentum_.SurvivesAKill(step_id - 1);
}

absl::Status StepEngine::SetPlan(
    const JobPlan& plan, const std::map<std::string, std::string>& addresses) {
  absl::MutexLock changing(&plan_change_mu_);
  MUONPS_ASSIGN_OR_RETURN(PlanState next,
                          BuildPlanState(plan, addresses, worker_id_));
  next.update_dtype = update_dtype_;
  {
    absl::MutexLock lock(&mu_);
    next.lender = backend_.windows.get();
    next.windows.set_counters(write_counters_);
  }
  // Allocated (and zero-filled) before the lock: Attach, heartbeats and
  // the momentum calls never wait for it; a step in progress goes on.
  MUONPS_RETURN_IF_ERROR(next.AllocateBuffers(*ops_));
  MUONPS_ASSIGN_OR_RETURN(PreparedMomentum momentum,
                          momentum_.Prepare(next.MomentumLayout()));
  next.momentum = &momentum_;
  PlanState replaced;  // freed once the lock is released
  absl::MutexLock lock(&mu_);
  // The transport of the old version goes first: its pending work may
  // still name the old buffers. Aborted, not finalized: a finalize waits
  // for peers that may be gone.
  transport_.Drop(absl::CancelledError(
      absl::StrCat("plan version ", next.version, " replaced it")));
  // Momentum of items this worker keeps owning moves to the new stacks; so
  // does a step staged in doubt (its new momentum), which may still commit.
  MUONPS_RETURN_IF_ERROR(
      momentum_.Install(std::move(momentum), ledger_.staged.voted));
  replaced = std::exchange(plan_, std::move(next));
  transport_.Publish(plan_.version, plan_.ownership.worker_ids);
  return absl::OkStatus();
}

absl::StatusOr<AttachResponse> StepEngine::Attach(
    const AttachRequest& request) {
  if (request.trainer_count < 1 || request.trainer_rank < 0 ||
      request.trainer_rank >= request.trainer_count) {
    return InvalidField(
        "trainer_rank",
        absl::StrCat(request.trainer_rank, " of ", request.trainer_count,
                     " is not a valid rank"));
  }
  if (request.trainer_pid < 0) {
    return InvalidField("trainer_pid",
                        absl::StrCat(request.trainer_pid, " < 0"));
  }
  trainer_asked_ms_.store(absl::ToUnixMillis(absl::Now()));
  trainer_rank_.store(request.trainer_rank);
  TrainerBuffersOpener open;
  kernels::DeviceOps* ops = nullptr;
  WindowLender* lender = nullptr;
  std::vector<scheduler::MatrixSpec> matrices;
  int replicas = 0;
  {
    absl::MutexLock lock(&mu_);
    open = backend_.open_buffers;
    ops = backend_.ops.get();
    lender = backend_.windows.get();
    if (plan_.rank >= 0 && plan_.rank >= plan_.trainers()) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition, "device",
          absl::StrCat("worker ", Quoted(worker_id_),
                       " is dedicated (--dedicated): it takes no trainer; "
                       "attach to the worker of your GPU"));
    }
    if (plan_.rank < 0) return NoPlanYet();
    MUONPS_RETURN_IF_ERROR(FollowsReplicaGroups(request.trainer_rank));
    // A shared-memory segment is mapped only when it is named for this job
    // and the attaching trainer (lending/trainer_segment.h).
    if (!request.segment.empty()) {
      MUONPS_RETURN_IF_ERROR(
          CheckTrainerSegmentName(request.segment, plan_.job.name,
                                  request.trainer_rank, request.trainer_pid));
    }
    matrices = plan_.matrices;
    replicas = plan_.job.replicas;
  }
  // Mapping (shm_open, cudaIpcOpenMemHandle), checking every binding and
  // allocating the work buffers are slow: outside the lock, against the
  // job's matrices as they were (checked again below).
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<TrainerBuffers> buffers,
                          open(request));
  if (buffers->device() != device_) {
    return InvalidField(
        "device",
        absl::StrCat("the trainer lends ", DeviceName(buffers->device()),
                     " memory; worker ", Quoted(worker_id_), " runs on ",
                     DeviceName(device_)));
  }
  MUONPS_ASSIGN_OR_RETURN(AttachedTrainer trainer,
                          BindTrainer(request, matrices, replicas, *buffers));
  // What a worker before this one wrote of the parameters' steps.
  absl::StatusOr<StepRecord> record = buffers->ReadRecord();
  if (record.ok()) {
    trainer.inherited = *record;
  } else if (!absl::IsNotFound(record.status())) {
    return Annotate(record.status(), "step_record");
  }

  // The device ops allocate thread-safely; only their use in a step is
  // ordered by the lock.
  MUONPS_RETURN_IF_ERROR(
      trainer.AllocateWorkBuffers(*ops, update_dtype_, lender));
  // A restarted worker (nothing committed since it started) takes the
  // record's step as its last; the step's AdamW means died with its
  // predecessor's staging, so they come back from its checkpoint of that
  // step, read here, outside the lock.
  const int64_t means_step =
      ledger_.last.load() < 0 && trainer.inherited.applied >= 0 &&
              !trainer.unreduced.empty()
          ? LoadCheckpointedMeans(trainer, trainer.inherited.applied, *ops)
          : -1;
  trainer.buffers = std::move(buffers);
  absl::MutexLock lock(&mu_);
  if (plan_.rank < 0) return NoPlanYet();
  if (!SameMatrices(plan_.matrices, matrices)) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "plan",
                      "the job was created again while the trainer "
                      "attached: attach again");
  }
  const int with_trainers = plan_.trainers();
  // The data plane pairs every worker but the dedicated ones with one
  // trainer, so a plan with another number of them is one the others have
  // not joined yet: the client retries until they have.
  if (with_trainers != request.trainer_count ||
      plan_.ownership.dedicated != plan_.job.dedicated_workers) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan",
        absl::StrCat("plan version ", plan_.version, " has ", with_trainers,
                     " workers with trainers and ", plan_.ownership.dedicated,
                     " dedicated ones; the job has ", request.trainer_count,
                     " trainers and expects ", plan_.job.dedicated_workers,
                     " dedicated workers: waiting for the workers to join"));
  }
  // A pending transfer may name the old trainer's memory: drop the
  // transport (rebuilt at the next step) before unmapping it, and the step
  // staged for it.
  transport_.Drop(absl::CancelledError("a trainer attached"));
  if (ledger_.staged.step_id >= 0) {
    spdlog::warn(
        "worker={} step={} staged in doubt: dropped, a trainer "
        "attached",
        worker_id_, ledger_.staged.step_id);
  }
  DropStaged(ledger_, plan_);
  ledger_.means_step = -1;
  AdoptRecordLocked(trainer.inherited);
  if (means_step >= 0 && ledger_.last.load() == means_step) {
    ledger_.means_step = means_step;
  }
  ledger_.trainer_behind.reset();
  ledger_.last_at_attach = ledger_.last.load();
  trainer_ = std::move(trainer);
  trainer_pid_.store(request.trainer_pid);
  spdlog::info("worker={} trainer {}/{} attached {} tensors ({})", worker_id_,
               trainer_->rank, trainer_->count, request.tensors.size(),
               DeviceName(device_));
  return AttachResponse{plan_.version, plan_.rank};
}

absl::Status StepEngine::EnsureTransport() {
  bool built = false;
  MUONPS_ASSIGN_OR_RETURN(
      transport::Transport* const transport,
      transport_.Ensure(plan_.rank, plan_.addresses, plan_.version,
                        momentum_.handover_failed(), &built));
  if (!built) return absl::OkStatus();
  // The plan's splits, before any other call on the new transport (each a
  // collective: NCCL splits a communicator per group, every rank taking
  // part): its owner groups, or the rails of its exchange nodes where they
  // sum unreduced gradients (rows relayed between them go point to point).
  std::vector<std::vector<int>> groups;
  transport::Split split = transport::Split::kOwnerGroups;
  if (plan_.groups.count() > 1) {
    for (int g = 0; g < plan_.groups.count(); ++g) {
      const std::vector<int32_t>& members = plan_.groups.members(g);
      groups.emplace_back(members.begin(), members.end());
    }
  } else if (scheduler::SumsOverNodes(plan_.schedule.exchange_nodes,
                                      plan_.matrices)) {
    split = transport::Split::kRails;
    groups = scheduler::RailsOf(plan_.schedule.exchange_nodes);
  }
  if (!groups.empty()) {
    const absl::Status formed = transport->FormSplit(split, groups);
    if (!formed.ok()) {
      const absl::Status failed =
          Annotate(ExplainReplaced(formed, StepRequest(), nullptr),
                   absl::StrCat("worker ", Quoted(worker_id_), " plan version ",
                                plan_.version, ": forming ", groups.size(), " ",
                                transport::SplitName(split)));
      transport_.Drop(failed);
      return failed;
    }
  }
  bool transport_ok = true;
  const absl::Status status =
      momentum_.HandOver(*transport, plan_.scratch.get(), ledger_.last.load(),
                         backend_.timeout, &transport_ok);
  if (status.ok() || transport_ok) return status;
  const absl::Status failed =
      Annotate(ExplainReplaced(status, StepRequest(), nullptr),
               absl::StrCat("worker ", Quoted(worker_id_), " plan version ",
                            plan_.version));
  transport_.Drop(failed);
  return failed;
}

absl::Status StepEngine::WithTornParameters(const absl::Status& refused) const {
  const int64_t torn = trainer_->inherited.torn();
  if (torn < 0 || ledger_.last.load() >= torn ||
      refused.code() != absl::StatusCode::kFailedPrecondition) {
    return refused;
  }
  return absl::Status(
      refused.code(),
      absl::StrCat(
          refused.message(), "; and ",
          TornParameters(absl::StrCat("worker ", Quoted(worker_id_)), torn),
          ", which only a peer trainer's parameters repair; without "
          "one, ",
          ReloadFrom(torn - 1)));
}

absl::Status StepEngine::ExplainReplaced(const absl::Status& failed,
                                         const StepRequest& request,
                                         const AttachedTrainer* trainer) const {
  const absl::Status why = transport_.Replaced();
  if (why.ok() || failed.ok()) return failed;
  // The transport's own words (NCCL quotes the abort's reason, TCP says
  // a socket was shut down) follow the reason.
  std::string message =
      absl::StrContains(failed.message(), why.message())
          ? std::string(failed.message())
          : absl::StrCat(why.message(), "; the step's transport was aborted (",
                         failed.message(), ")");
  // Neither committed nor staged in doubt: the step left nothing here. (A
  // rank in doubt, or one that committed, already says so.)
  if (trainer != nullptr && !ledger_.staged.voted &&
      ledger_.last.load() < request.step_id) {
    absl::StrAppend(&message, "; step ", request.step_id,
                    " was not applied on this worker: retry it");
  }
  return absl::Status(failed.code() == absl::StatusCode::kDataLoss
                          ? absl::StatusCode::kDataLoss
                          : why.code(),
                      message);
}

absl::StatusOr<std::vector<float>> StepEngine::Momentum(
    const std::string& matrix, int64_t expert) const {
  absl::MutexLock lock(&mu_);
  return momentum_.Get(matrix, expert);
}

absl::Status StepEngine::SetMomentum(const std::string& matrix, int64_t expert,
                                     std::vector<float> values) {
  MUONPS_ASSIGN_OR_RETURN(CheckedMomentum checked,
                          momentum_.Check(matrix, expert, std::move(values)));
  absl::MutexLock lock(&mu_);
  const int64_t staged = ledger_.staged.step_id;
  MUONPS_RETURN_IF_ERROR(momentum_.Write(std::move(checked)).status());
  ForgetStaged(staged, "momentum is being restored");
  return absl::OkStatus();
}

absl::Status StepEngine::RestoreMissingMomentum() {
  absl::MutexLock lock(&mu_);
  return momentum_.RestoreMissing(ledger_.last.load());
}

absl::StatusOr<int64_t> StepEngine::RestoreCheckpoint(const std::string& dir,
                                                      int64_t step) {
  MUONPS_ASSIGN_OR_RETURN(CheckedMomentum read,
                          momentum_.ReadCheckpoint(dir, step));
  absl::MutexLock lock(&mu_);
  const int64_t staged = ledger_.staged.step_id;
  MUONPS_ASSIGN_OR_RETURN(const int64_t restored,
                          momentum_.Write(std::move(read)));
  ForgetStaged(staged, "momentum is being restored from a checkpoint");
  return restored;
}

void StepEngine::ForgetStaged(int64_t staged, const char* why) {
  if (staged < 0) return;
  // The store dropped its new momentum with the write; its updates go too.
  spdlog::warn("worker={} step={} staged in doubt: dropped, {}", worker_id_,
               staged, why);
  DropStaged(ledger_, plan_);
}

}  // namespace worker
}  // namespace muonps
