// StepEngine: a worker's part of the data plane. It holds the plan
// version's state (step_state.h: its schedule and the stacks' staged
// gradients), the owned momentum (a MomentumStore), the trainer's lent
// buffers (shared memory or CUDA IPC, through a TrainerBuffers) and the
// version's transport (a PlanTransport: TCP among CPU workers, NCCL among
// GPU workers), and runs each optimizer step as StepRun rounds with the
// other workers of the plan. Steps are atomic and idempotent: step_run.h
// has the protocol. Device-agnostic: its factory (main.cc) hands it a
// StepBackend.
//
// Thread-safe. One lock serializes steps, the installs of plan changes,
// attachments and the momentum calls that use the device (the
// MomentumStore's device rule), and a step holds it across its network I/O
// (up to the transport's timeout), and the write of a checkpoint due at
// that step (before its vote). Nothing else slow runs under it: SetPlan
// allocates its buffers and Attach maps the trainer's before taking it.
// What status
// and heartbeats call never waits for it: last_step() and the momentum
// counters are atomic reads, SetDataPlaneSecret and AbortForPlan take
// PlanTransport's small locks (never held across I/O), ReleaseTrainerIfGone
// only tries the lock.
#ifndef MUONPS_SERVER_WORKER_STEP_ENGINE_H_
#define MUONPS_SERVER_WORKER_STEP_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"
#include "kernels/device_ops.h"
#include "kernels/muon_kernels.h"
#include "server/worker/attach_request.h"
#include "server/worker/checkpoint_writer.h"
#include "server/worker/job_plan.h"
#include "server/worker/momentum_store.h"
#include "server/worker/plan_transport.h"
#include "server/worker/step_backend.h"
#include "server/worker/step_commit.h"
#include "server/worker/step_request.h"
#include "server/worker/step_run.h"
#include "server/worker/step_state.h"
#include "server/worker/trainer_binding.h"
#include "server/worker/trainer_buffers.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

class StepEngine {
 public:
  StepEngine(std::string worker_id, StepBackend backend,
             TransportFactory make_transport);
  StepEngine(const StepEngine&) = delete;
  StepEngine& operator=(const StepEngine&) = delete;
  ~StepEngine();

  // Sets the job's data-plane secret (JoinJobResponse's, at least 16 bytes),
  // which every transport built from now on gets from the factory; call it
  // on joining the job, before the first plan is applied. Not validated
  // here: a bad one fails the next transport build (the next Step), naming
  // the field. A transport built with another secret is rebuilt at the next
  // step. Never waits for a step in progress (the agent calls it when it
  // re-joins, on its heartbeat thread). Kept in memory, never logged.
  void SetDataPlaneSecret(std::string secret) {
    transport_.SetSecret(std::move(secret));
  }

  // Test-only (the chaos tests' worker flag): called at each StepPoint of
  // every step. Set before the first step.
  void set_step_hook(StepHook hook);

  // A new plan version of the job (wire.h converts the coordinator's) and
  // every worker's data address (by worker id). Its buffers are allocated
  // before the lock is taken (a step in progress goes on; Attach and status
  // never wait for it), then the momentum is installed
  // (MomentumStore::Install: what this worker keeps owning stays, what
  // moves away waits for the handover, which brings every newly owned
  // matrix from its previous owner on the version's new transport before
  // its first step). A newly owned matrix whose previous owner left fails
  // every step of the version with FAILED_PRECONDITION naming it, unless
  // the job allows momentum resets: it then starts at zero (counted in
  // momentum_resets_total() and the next step's momentum_reset).
  // INVALID_ARGUMENT naming the plan field for an inconsistent plan,
  // RESOURCE_EXHAUSTED when the stacks do not fit the device. One SetPlan
  // at a time.
  absl::Status SetPlan(const JobPlan& plan,
                       const std::map<std::string, std::string>& addresses);

  // Call with every plan as soon as it arrives, before SetPlan (which waits
  // for a step in progress): when `next` drops workers of the current plan,
  // the transport is aborted at once (PlanTransport::AbortFor) and a step
  // waiting on a lost worker fails now, as for any lost peer (step_run.h),
  // with UNAVAILABLE saying `plan version N replaced by M: worker "w1" left
  // the job (<reason>)`, as does every step until a plan at least as new as
  // `next` is set. Returns whether `next` replaced the plan that way. Never
  // waits for a step.
  bool AbortForPlan(const PlanMembership& next) {
    return transport_.AbortFor(next);
  }

  // Maps the trainer's buffers and checks every binding against the job
  // (BindTrainer, trainer_binding.h: INVALID_ARGUMENT naming the tensor,
  // before anything is mapped), outside the lock. The bindings' parameter
  // groups stay attached: a step's values reach them by index.
  // FAILED_PRECONDITION before a plan, and while the plan's worker count
  // differs from the trainer count (the other workers have not joined yet;
  // the client retries). INVALID_ARGUMENT naming `segment` when a
  // shared-memory segment is not named for this job, the trainer's rank and
  // pid (trainer_segment.h); PERMISSION_DENIED when another user owns it.
  // Drops a step staged for the previous trainer.
  absl::StatusOr<AttachResponse> Attach(const AttachRequest& request);
  static constexpr int64_t kMaxLentElements = worker::kMaxLentElements;

  // One step, atomic across the workers (step_run.h). A step id at or
  // below the last one this worker knows every worker committed answers
  // already_applied at once; a retry of a step that may be in doubt
  // somewhere runs a round with the peers, which commits it from staging or
  // redoes it cleanly. A step that comes while a plan newer than the
  // installed one, keeping every worker, is on its way in (AbortForPlan saw
  // it) waits for its SetPlan, up to the transport's timeout, and runs on
  // it (one that drops a worker refuses the step at once). Errors:
  // INVALID_ARGUMENT naming the field for a bad
  // request (rejected everywhere, nothing changed); FAILED_PRECONDITION
  // with no plan or trainer; UNAVAILABLE or DEADLINE_EXCEEDED for a lost
  // peer, saying whether this worker applied the step; ABORTED or
  // CANCELLED when a trainer's call was cancelled before the commit
  // (nothing applied); DATA_LOSS when the workers cannot tell whether a
  // trainer's parameters hold a step. `cancelled` (may be null) says
  // whether the caller gave up: checked before the vote.
  absl::StatusOr<StepResponse> Step(const StepRequest& request,
                                    const StepCancelled& cancelled = {});

  // A dedicated worker (no trainer; the plan ranks it among its last
  // `dedicated_workers`): waits up to `wait` for the trainers' workers to
  // open the next step on the transport and runs its part of it (its
  // matrices' momentum and Newton-Schulz, zeros into every sum). nullopt
  // when no step opened (or this worker is not a dedicated rank of a plan:
  // it then sleeps `wait`); the step's response otherwise. One thread calls
  // it in a loop. Holds the engine's lock for at most `wait` while idle.
  absl::StatusOr<std::optional<StepResponse>> FollowStep(absl::Duration wait);

  // Owned matrices (experts) that restarted from zero momentum since the
  // engine started (MomentumStore::resets_total). Never waits.
  int64_t momentum_resets_total() const { return momentum_.resets_total(); }

  // The last step id committed here (-1 before the first), and the plan
  // version it committed under (0: none). Never wait for a step in
  // progress. Thread-safe.
  int64_t last_step() const;
  int64_t last_step_plan_version() const;

  // The worker is leaving: waits for a step in progress to end, then
  // refuses every later Step and FollowStep with UNAVAILABLE saying `why`,
  // so the worker leaves with no step half done here. Idempotent.
  void StopStepping(const std::string& why);
  // After StopStepping: writes the momentum this worker holds (owned, or
  // kept for a handover no step carried) as the job's checkpoint of its
  // last committed step (MomentumStore::PersistHeld); how many items.
  absl::StatusOr<int64_t> PersistHeldMomentum();

  // Whether a trainer is attached and its process still runs. Never waits.
  bool TrainerAlive() const;

  // Whether a trainer is attached, or asked to attach (or stepped while
  // this worker was not a rank) within `recent`
  // (a standby's trainer: the heartbeat tells the coordinator, which then
  // ranks this worker in place of one whose trainer never came). Never
  // waits.
  bool HasTrainer(absl::Duration recent) const;
  // The rank the trainer that last asked to attach named (attached or
  // refused: a standby's), -1 before any. Never waits.
  int trainer_rank() const { return trainer_rank_.load(); }

  // Releases the attached trainer's buffers (unmapping its CUDA IPC or
  // shared memory, so its GPU memory can be freed) when its process is
  // gone. Never waits for a step: with one in progress it does nothing and
  // a later call retries. Returns true if it released them. Thread-safe.
  bool ReleaseTrainerIfGone();

  // The owned momentum (MomentumStore and MomentumCheckpoints have each
  // call's contract). Calls that use the device wait for a step in
  // progress; checks and checkpoint reads happen before the lock.
  //
  // A copy of expert `expert` of `matrix`'s momentum (MomentumStore::Get).
  absl::StatusOr<std::vector<float>> Momentum(const std::string& matrix,
                                              int64_t expert) const;
  // Restores it (MomentumStore::Check, then Write), dropping a step staged
  // in doubt (a restore starts from what it writes).
  absl::Status SetMomentum(const std::string& matrix, int64_t expert,
                           std::vector<float> values);
  // Call once, before the first plan: while the job's checkpoint_dir is
  // set, every step that is due has its new momentum written to
  // <checkpoint_dir>/<worker_id>/ before its vote (MomentumStore::
  // PersistStaged): a step commits only once every owner's checkpoint of
  // it is on disk.
  // Counts the updates owners write into the peers' staging
  // (staging_windows.h) from the next plan version on.
  void CountPeerWrites(WriteCounters counters) {
    absl::MutexLock lock(&mu_);
    write_counters_ = counters;
  }
  void EnableCheckpoints(MetricsRegistry* metrics) {
    momentum_.EnableCheckpoints(metrics);
  }
  // A checkpoint of the next step staged; never waits.
  absl::StatusOr<int64_t> RequestCheckpoint() {
    return momentum_.RequestCheckpoint();
  }
  int64_t last_checkpoint_step() const {
    return momentum_.last_checkpoint_step();
  }
  int64_t restored_step() const { return momentum_.restored_step(); }
  // Call after every SetPlan (MomentumStore::RestoreMissing). Holds the
  // engine's lock while it reads the checkpoints: no step may start from
  // zero meanwhile.
  absl::Status RestoreMissingMomentum();
  // Worker.RestoreCheckpoint: every owned expert from checkpoint `step` of
  // `dir`, all or nothing (MomentumStore::ReadCheckpoint, then Write),
  // dropping a step staged in doubt. Returns how many experts it restored.
  absl::StatusOr<int64_t> RestoreCheckpoint(const std::string& dir,
                                            int64_t step);
  // Waits for the checkpoint being written, if any (tests, shutdown).
  absl::Status WaitForCheckpoint() { return momentum_.WaitForCheckpoint(); }

 private:
  // Step under mu_.
  absl::StatusOr<StepResponse> StepLocked(const StepRequest& request,
                                          const StepCancelled& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FollowStep's round on a dedicated rank, the same way.
  absl::StatusOr<std::optional<StepResponse>> FollowLocked(absl::Duration wait)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the step staged in doubt, if any (`staged`: its id as it was
  // before the momentum changed; -1: none), logging `why`.
  void ForgetStaged(int64_t staged, const char* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION naming `plan`: no plan yet, or not in it.
  absl::Status NoPlanYet() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a job of HSDP replica groups (JobSettings::replicas > 1): OK once
  // the plan has one owner group per replica group and this worker is in
  // the one of trainer `trainer_rank`; else FAILED_PRECONDITION naming
  // `plan`, which an attaching client retries.
  absl::Status FollowsReplicaGroups(int trainer_rank) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker that has committed nothing (it restarted) takes the last step
  // its trainer's step record says the parameters wholly hold as its last
  // committed one: its predecessor committed it into them.
  void AdoptRecordLocked(const StepRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Step `step`'s AdamW means from this worker's checkpoint of it into
  // `trainer`'s staging (ops' stream, waited for): `step` once they are
  // there, -1 when the checkpoint lacks them (logged). Reads files: call
  // without the lock, for a trainer not attached yet.
  int64_t LoadCheckpointedMeans(const AttachedTrainer& trainer, int64_t step,
                                kernels::DeviceOps& ops);
  // A trainer's step that says it resumed from its state saved after step
  // `resumed_after` (StepRequest::resumed_after): a worker that committed
  // nothing since it started takes that as its last committed step; one
  // that committed past it before this trainer attached marks the
  // parameters behind (StepLedger::trainer_behind), for a repair.
  void TakeResumeLocked(int64_t resumed_after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds the transport if there is none, and runs the momentum handover
  // on every new one; the handover's FAILED_PRECONDITION (lost momentum)
  // stays for the rest of the plan version. A handover that fails on the
  // transport drops it.
  absl::Status EnsureTransport() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one round for `trainer`, or for no trainer (a dedicated worker);
  // a transport out of step with the peers is dropped, and errors name the
  // ranks' workers.
  RoundResult RunRound(const StepRequest& request,
                       const AttachedTrainer* trainer,
                       const StepCancelled& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether this worker's settings and plan let updates go into the
  // parameters before the commit at all (StepContext::apply_early; the
  // plan's clock may have found the commit faster: JobSettings::
  // apply_at_commit), and
  // whether step `step_id` may: where a kill of this worker part-way through
  // it would lose nothing otherwise (its momentum on disk or resettable),
  // the parameters are not put at risk either. With owner groups, whose
  // copies of the momentum survive a kill, only where a peer's trainer can
  // repair the parameters (whole matrices: not HSDP's rows). A step applies
  // early where both hold.
  bool MayApplyEarly() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool StepMayApplyEarly(int64_t step_id) const;
  // The response for a step answered without running it.
  StepResponse AlreadyApplied(int64_t step_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // A step refused before its round (FAILED_PRECONDITION: momentum lost)
  // on a trainer whose parameters hold part of a step since a worker before
  // this one stopped writing them: says so too, and what to reload.
  absl::Status WithTornParameters(const absl::Status& refused) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A failed round's status once AbortForPlan aborted its transport:
  // UNAVAILABLE with the reason first (DATA_LOSS stays DATA_LOSS).
  absl::Status ExplainReplaced(const absl::Status& failed,
                               const StepRequest& request,
                               const AttachedTrainer* trainer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string worker_id_;
  const Device device_;
  // backend_'s ops, for what allocates outside mu_ (thread-safe).
  kernels::DeviceOps* const ops_;
  // The precision of backend_'s updates (MuonKernels::update_dtype).
  const DType update_dtype_;
  // backend_'s timeout, for what waits outside mu_: how long a step waits
  // for a plan that arrived to be installed.
  const absl::Duration io_timeout_;
  // One SetPlan at a time: each prepares its stacks against the installed
  // version before it takes mu_.
  absl::Mutex plan_change_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  StepBackend backend_ ABSL_GUARDED_BY(mu_);
  WriteCounters write_counters_ ABSL_GUARDED_BY(mu_);
  // Its device calls are made under mu_ (its device rule); destroyed before
  // backend_.
  MomentumStore momentum_;
  // Its transport is used under mu_; SetSecret, AbortFor and Replaced are
  // called without it.
  PlanTransport transport_;
  PlanState plan_ ABSL_GUARDED_BY(mu_);
  std::optional<AttachedTrainer> trainer_ ABSL_GUARDED_BY(mu_);
  StepHook hook_ ABSL_GUARDED_BY(mu_);
  // Set by StopStepping: why steps are refused.
  std::optional<std::string> stopped_ ABSL_GUARDED_BY(mu_);
  // Its `last` is written under mu_ and read without it (status and
  // heartbeats never wait for a step in progress).
  StepLedger ledger_;
  // The attached trainer's pid (0: none or unknown), readable without mu_.
  std::atomic<int64_t> trainer_pid_{0};
  // When a trainer last asked to attach, or stepped while this worker was
  // not a rank (absl::ToUnixMillis), whatever the answer; 0: never.
  std::atomic<int64_t> trainer_asked_ms_{0};
  // trainer_rank(), readable without mu_.
  std::atomic<int> trainer_rank_{-1};
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_ENGINE_H_
