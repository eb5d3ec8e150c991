// StepEngine: a worker's part of the data plane. It holds the plan
// version's state (its schedule and the stacks' staged gradients), the
// owned matrices' momentum (a MomentumStore: same-shape stacks per plan
// version, checkpoints, the handover), the trainer's lent buffers (shared
// memory or CUDA IPC, through a TrainerBuffers), and runs
// each optimizer step as StepRun rounds with the other workers of the plan
// over a Transport built for that plan version (TCP among CPU workers, NCCL
// among GPU workers). Steps are atomic and idempotent: step_run.h has the
// protocol (staging, votes, commit, and how a retry settles a step some
// workers committed).
//
// The engine is device-agnostic: its factory (server/worker/main.cc) hands
// it the backend, a MuonKernels and DeviceOps pair on one device and stream
// (CPU: OpenBLAS on host memory; CUDA: cuBLAS on the GPU), and a way to
// open the trainer's buffers.
//
// Thread-safe. One lock serializes steps, the installs of plan changes,
// attachments and the momentum calls that use the device (the
// MomentumStore's device rule), and a step holds it across its network I/O
// (up to the transport's timeout). Nothing slow runs under it but a step:
// SetPlan allocates its stacks and Attach maps the trainer's buffers before
// taking it, and a checkpoint is written after it is released. What status
// and heartbeats call never waits for it: last_step() and the momentum
// counters are atomic reads, SetDataPlaneSecret takes its own small lock,
// ReleaseTrainerIfGone only tries the lock. AbortForPlan (the agent's
// watch thread, as soon as a new plan arrives) takes only another small
// lock, which guards the current plan's membership and transport and is
// never held across the step's I/O: it aborts a step waiting on a worker
// the new plan dropped, so that SetPlan need not wait for the timeout.
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
  // every worker's data address (by worker id). Momentum of matrices this
  // worker keeps owning moves to the new stacks; that of matrices moving away
  // is kept, and the handover (momentum_handover.h) brings every newly owned
  // one from its previous owner when the new transport is built, before the
  // version's first step. A newly owned matrix whose previous owner left fails
  // every step of the version with FAILED_PRECONDITION naming it, unless the
  // job allows momentum resets: it then starts at zero (logged, counted in
  // momentum_resets_total() and the next Step response's momentum_reset).
  // The transport is rebuilt at the next step. The new stacks are allocated
  // before the engine's lock is taken (a step in progress finishes first;
  // Attach and status never wait for the allocation). INVALID_ARGUMENT
  // naming the plan field for an inconsistent plan, RESOURCE_EXHAUSTED when
  // the stacks do not fit the device. One SetPlan at a time.
  absl::Status SetPlan(const JobPlan& plan,
                       const std::map<std::string, std::string>& addresses);

  // Call with every plan as soon as it arrives, before SetPlan (which waits
  // for a step in progress). When `next` is newer than the current plan and
  // leaves out some of its workers, no step of the current plan can finish:
  // its transport (TCP or NCCL) is aborted at once, so a step waiting on a
  // lost worker fails now instead of at the transport's timeout. That step
  // fails as for any lost peer (step_run.h: before its vote nothing was
  // applied; a rank in doubt keeps its staging for the retry), with
  // UNAVAILABLE saying `plan version N replaced by M: worker "w1" left the
  // job (<the plan's reason>)`, and so does every step until a plan at
  // least as new as `next` is set (none runs on the old plan's transport).
  // Returns whether `next` replaced the current plan that way. Never waits
  // for a step. Thread-safe.
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
  // redoes it cleanly. Errors: INVALID_ARGUMENT naming the field for a bad
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

  // How many owned matrices (experts) have started from zero momentum
  // because their owner changed, their previous owner was gone and the job
  // allows momentum resets, or a restore was of another step, since the
  // engine started. Never waits for a step. Thread-safe.
  int64_t momentum_resets_total() const { return momentum_.resets_total(); }

  // The last step id committed here (-1 before the first). Never waits for
  // a step in progress. Thread-safe.
  int64_t last_step() const;

  // Releases the attached trainer's buffers (unmapping its CUDA IPC or
  // shared memory, so its GPU memory can be freed) when its process is
  // gone. Never waits for a step: with one in progress it does nothing and
  // a later call retries. Returns true if it released them. Thread-safe.
  bool ReleaseTrainerIfGone();

  // The owned momentum (MomentumStore has each call's contract), its calls
  // that use the device ordered with the steps (they wait for one in
  // progress).
  //
  // A copy of the momentum of expert `expert` of `matrix`; NOT_FOUND unless
  // this worker owns it and has stepped (or restored) it.
  absl::StatusOr<std::vector<float>> Momentum(const std::string& matrix,
                                              int64_t expert) const;
  // Restores it (checked before the lock): NOT_FOUND unless this worker
  // owns the expert in the current plan; INVALID_ARGUMENT for a wrong size
  // or non-finite values. Drops a step staged in doubt (a restore starts
  // from the checkpoint). A restored expert is no longer lost for the next
  // plan's handover.
  absl::Status SetMomentum(const std::string& matrix, int64_t expert,
                           std::vector<float> values);
  // Momentum checkpoints. Call once, before the first plan; without it the
  // engine writes and restores none. `metrics` (may be null) must outlive
  // the engine. While the job's checkpoint_dir is set, every step
  // committed here whose id is a multiple of checkpoint_every (or the first
  // one after RequestCheckpoint) is copied to host memory under the locks
  // and written to <checkpoint_dir>/<worker_id>/ in the background once
  // they are released (that step's call waits only if the previous
  // checkpoint is still being written).
  void EnableCheckpoints(MetricsRegistry* metrics) {
    momentum_.EnableCheckpoints(metrics);
  }
  // Asks for a checkpoint right after the next step committed here; never
  // waits for a step. FAILED_PRECONDITION when checkpoints are not enabled
  // or the job has no checkpoint_dir. Returns the last step checkpointed
  // (-1: none).
  absl::StatusOr<int64_t> RequestCheckpoint() {
    return momentum_.RequestCheckpoint();
  }
  // The last step whose checkpoint was written durably (-1: none). Never
  // waits for a step. Thread-safe.
  int64_t last_checkpoint_step() const {
    return momentum_.last_checkpoint_step();
  }
  // The step the momentum restored from a checkpoint is as of (-1: none).
  int64_t restored_step() const { return momentum_.restored_step(); }
  // Call after every SetPlan: MomentumStore::RestoreMissing as of this
  // worker's last committed step. Holds the engine's lock while it reads
  // the checkpoints (a step must not start from zero meanwhile).
  absl::Status RestoreMissingMomentum();
  // Replaces the momentum of every expert owned here with checkpoint
  // `step` of `dir` (Worker.RestoreCheckpoint), all or nothing, read
  // before the lock, and drops a step staged in doubt. Returns how many
  // experts it restored. Errors: MomentumStore::ReadCheckpoint's and
  // Write's.
  absl::StatusOr<int64_t> RestoreCheckpoint(const std::string& dir,
                                            int64_t step);
  // Waits for the checkpoint being written, if any (tests, shutdown).
  absl::Status WaitForCheckpoint() { return momentum_.WaitForCheckpoint(); }

 private:
  // Step under mu_; a checkpoint due after it comes back in *snapshot, to
  // be written once the lock is released.
  absl::StatusOr<StepResponse> StepLocked(
      const StepRequest& request, const StepCancelled& cancelled,
      std::optional<CheckpointSnapshot>* snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FollowStep's round on a dedicated rank, the same way.
  absl::StatusOr<std::optional<StepResponse>> FollowLocked(
      absl::Duration wait, std::optional<CheckpointSnapshot>* snapshot)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the step staged in doubt, if any (`staged`: its id as it was
  // before the momentum changed; -1: none), logging `why`.
  void ForgetStaged(int64_t staged, const char* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION naming `plan`: no plan yet, or not in it.
  absl::Status NoPlanYet() const;
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
  // The response for a step answered without running it.
  StepResponse AlreadyApplied(int64_t step_id) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
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
  // One SetPlan at a time: each prepares its stacks against the installed
  // version before it takes mu_.
  absl::Mutex plan_change_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  StepBackend backend_ ABSL_GUARDED_BY(mu_);
  // Its device calls are made under mu_ (its device rule); destroyed before
  // backend_.
  MomentumStore momentum_;
  // Its transport is used under mu_; SetSecret, AbortFor and Replaced are
  // called without it.
  PlanTransport transport_;
  PlanState plan_ ABSL_GUARDED_BY(mu_);
  std::optional<AttachedTrainer> trainer_ ABSL_GUARDED_BY(mu_);
  StepHook hook_ ABSL_GUARDED_BY(mu_);
  // Its `last` is written under mu_ and read without it (status and
  // heartbeats never wait for a step in progress).
  StepLedger ledger_;
  // The attached trainer's pid (0: none or unknown), readable without mu_.
  std::atomic<int64_t> trainer_pid_{0};
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_ENGINE_H_
