// MomentumStore: the momentum of the matrices (experts) a worker owns, for
// its whole life: the installed plan version's stacks (momentum_stacks.h)
// and the staged step's new momentum beside them, one expert's reads and
// writes, checkpoints (written in the background by a CheckpointWriter;
// restored by checkpoint_restore.h's rule), the handover when a plan version
// moves matrices between workers (momentum_handover.h), and the count of
// matrices that restarted from zero.
//
// Thread-safe, with one rule for the device. The store's lock guards the
// installed stacks and all of its bookkeeping, and is held only to read,
// swap or copy them: a swap of whole versions (Install) or of a staged
// step's momentum (CommitStaged), a copy between the device and the host
// (Get, Write, a checkpoint's snapshot, a restore) or within the device (the
// momentum a new version keeps). Never across transport I/O, disk reads and
// writes, or allocation: new stacks are allocated and zero-filled outside
// any lock (Prepare), then installed under the lock with a swap; a
// snapshot is copied to host under the lock and written outside it.
//
// The device rule. Install, Get, Write, PersistStaged, RestoreMissing,
// CheckMomentumStep and HandOver enqueue on the device ops' stream(),
// which a step uses too: the caller runs them one at a time and never
// during a step (StepEngine holds its own lock around them and its steps).
// A step writes the installed version's next_momentum (installed())
// without the store's lock, and the handover the momentum it receives; the
// commit's swap is under it. The other calls may come from any thread.
// Not copyable.
#ifndef MUONPS_SERVER_WORKER_MOMENTUM_STORE_H_
#define MUONPS_SERVER_WORKER_MOMENTUM_STORE_H_

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
#include "server/worker/checkpoint_restore.h"
#include "server/worker/checkpoint_writer.h"
#include "server/worker/momentum_checkpoints.h"
#include "server/worker/momentum_handover.h"
#include "server/worker/momentum_stacks.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// A plan version's stacks, allocated and ready to install (Prepare).
struct PreparedMomentum {
  MomentumStacks stacks;
  // Room for the momentum the current version hands over to `stacks`'
  // owners (null: nothing can move away).
  std::unique_ptr<kernels::FloatBuffer> outgoing;
  int64_t installs = 0;  // the store's install count when prepared
};

class MomentumStore {
 public:
  // Momentum of `worker_id` (named in errors and logs) on the device of
  // `ops`, which must outlive the store. No version is installed yet.
  MomentumStore(std::string worker_id, kernels::DeviceOps* ops);
  MomentumStore(const MomentumStore&) = delete;
  MomentumStore& operator=(const MomentumStore&) = delete;

  // ---- Plan versions.
  //
  // Allocates `layout`'s stacks (zero-filled) and the room for what the
  // installed version hands over to it, with no lock held (the store's
  // only briefly, to size that room). RESOURCE_EXHAUSTED naming the buffer
  // when the device is full; INVALID_ARGUMENT for a layout whose stacks
  // name items outside its matrices. The result is the caller's.
  absl::StatusOr<PreparedMomentum> Prepare(MomentumStacks layout) const;
  // Makes `next` the installed version, under the lock: momentum of the
  // items this worker keeps owning moves to its stacks (with
  // `carry_staged`, a step staged in doubt, which may still commit, comes
  // along); that of items moving away is kept for the handover, and items
  // coming back before a handover ran get theirs back. Setting the
  // installed version again keeps what its handover needs. The previous
  // stacks are freed after the lock is released. FAILED_PRECONDITION when
  // another version was installed since `next` was prepared (nothing
  // changed); INTERNAL when a device copy fails (nothing installed).
  absl::Status Install(PreparedMomentum next, bool carry_staged);
  // The installed version's stacks, for a step (its compute reads
  // `momentum` and writes next_momentum, next_has_momentum, next_valid) and
  // for the stacks' geometry (slots). Valid until the next Install; see the
  // device rule. Empty (version -1) before the first.
  MomentumStacks& installed();
  int64_t version() const;

  // ---- The staged step: its new momentum in next_momentum.
  //
  // Swaps every stack's staged new momentum in (the step commits).
  void CommitStaged();
  // Forgets it (the momentum stays as it was).
  void DropStaged();

  // ---- One expert.
  //
  // A copy of the momentum of expert `expert` of `matrix` (host memory,
  // rows x cols floats). NOT_FOUND naming it unless it is owned here and
  // holds momentum (stepped, handed over or restored).
  absl::StatusOr<std::vector<float>> Get(const std::string& matrix,
                                         int64_t expert) const;
  // `values` checked for expert `expert` of `matrix`: NOT_FOUND unless it is
  // owned here in the installed version; INVALID_ARGUMENT naming `values`
  // for a wrong size or non-finite values. Touches no device: call it
  // without the device rule's ordering.
  absl::StatusOr<CheckedMomentum> Check(const std::string& matrix,
                                        int64_t expert,
                                        std::vector<float> values) const;
  // The momentum of every expert owned here from checkpoint `step` of
  // `dir`, all read and checked (disk reads outside the lock).
  // INVALID_ARGUMENT naming `checkpoint_dir` or `step` when malformed,
  // FAILED_PRECONDITION naming `plan` with no version installed or one
  // without this worker, NOT_FOUND naming the first owned expert the
  // checkpoint lacks, INVALID_ARGUMENT for a shape mismatch; INTERNAL when
  // the directory cannot be listed.
  absl::StatusOr<CheckedMomentum> ReadCheckpoint(const std::string& dir,
                                                 int64_t step) const;
  // Writes `checked` into the installed stacks, all or nothing: each expert
  // must still be owned here with its shape (NOT_FOUND, INVALID_ARGUMENT),
  // and a checkpoint's be of the installed version (FAILED_PRECONDITION
  // naming `plan`); else nothing changes. Then the staged step's new momentum
  // is dropped (a restore starts from what it writes: the caller forgets the
  // rest of that step) and the experts hold momentum. From a caller: a written
  // expert is no longer lost for the next version's handover. From a
  // checkpoint: it counts as restored as of its step (restored_step()),
  // and the next step staged must be the one after it (CheckMomentumStep).
  // Returns how many experts it wrote. INTERNAL when a device copy fails.
  absl::StatusOr<int64_t> Write(CheckedMomentum checked);

  // ---- Checkpoints (MomentumCheckpoints has the policy and the rule).
  //
  // Call once, before the first Install; without it the store writes and
  // restores none. `metrics` (may be null) must outlive the store.
  void EnableCheckpoints(MetricsRegistry* metrics) {
    checkpoints_.Enable(metrics);
  }
  // Asks for a checkpoint of the next step staged.
  // FAILED_PRECONDITION naming job.checkpoint_dir when checkpoints are not
  // enabled or the installed version's job has no checkpoint_dir. Returns
  // the last step checkpointed (-1: none).
  absl::StatusOr<int64_t> RequestCheckpoint();
  // The staged step's AdamW means of the trainer's unreduced tensors (by
  // tensor name; the same on every worker), as a step's checkpoint keeps
  // them beside the momentum.
  using StagedMeans = std::map<std::string, std::vector<float>>;
  // Makes step `step`'s staged new momentum (every owned expert's
  // next_momentum) durable when the step is due for a checkpoint (a
  // multiple of checkpoint_every, or asked for) and not written yet in the
  // installed version: copied to host under the lock, written outside it,
  // with the step's AdamW means from `means` (called only when due; may be
  // empty). A step calls it after staging and before its vote, so that once
  // the step commits anywhere, every owner's checkpoint of it is on disk
  // and a worker killed right after the commit loses nothing; two workers
  // killed within the step lose no means either (ReadStagedMeans). OK when
  // nothing is due; else the device copy's or the write's error, naming
  // the step.
  absl::Status PersistStaged(
      int64_t step,
      const std::function<absl::StatusOr<StagedMeans>()>& means = {});
  // Whether PersistStaged(step) would write a checkpoint (a step due for
  // one must not commit before it is on disk). Never waits for a write.
  bool CheckpointDue(int64_t step) const;
  // The AdamW means this worker's checkpoint of step `step` holds (none
  // for a trainer with no unreduced tensors). NOT_FOUND when no checkpoint
  // of that step is in this worker's directory (or the job keeps none);
  // its verification's error otherwise. Reads files: call with no lock.
  absl::StatusOr<StagedMeans> ReadStagedMeans(int64_t step) const;
  // Makes the momentum this worker still holds as of step `step` durable
  // as the job's checkpoint of that step: every owned item's and every
  // item kept for a handover that has not run (a draining worker's, when
  // no step comes to carry the handover). Its new owners then restore it
  // as they would a lost owner's. Returns how many items were written.
  // FAILED_PRECONDITION naming job.checkpoint_dir when the job keeps no
  // checkpoints; else the device copy's or the write's error.
  absl::StatusOr<int64_t> PersistHeld(int64_t step);
  // The last step whose checkpoint was written durably (-1: none).
  int64_t last_checkpoint_step() const { return checkpoints_.last_written(); }
  // Whether a restart of this worker would go on from its momentum as of
  // `step`: the job's checkpoint of that step is on disk (written here, or
  // the one restored here), or the job allows a momentum reset.
  bool SurvivesAKill(int64_t step) const;
  // Waits for the checkpoint being written, if any; its status.
  absl::Status WaitForCheckpoint() { return checkpoints_.Wait(); }
  // Restores every owned expert with no momentum from the job's
  // checkpoint_dir when a verified checkpoint holds it as of the reference
  // step (MomentumCheckpoints::FindMissing): `last_committed`, or for a
  // worker that has committed none the newest checkpoint's step S (then
  // its trainer must resume from S: CheckMomentumStep). The others stay
  // at zero. Reads the checkpoints outside the lock. OK with nothing to do
  // (no checkpoints enabled, no directory, nothing missing); INTERNAL when
  // the directory cannot be listed or a device copy fails.
  absl::Status RestoreMissing(int64_t last_committed);
  // Step `step_id` stages on momentum as of step_id - 1 only
  // (MomentumStack::as_of). Owned experts whose momentum holds another
  // step (restored as of S by a worker that had committed nothing and
  // whose trainer did not resume from S + 1; handed over by a worker that
  // missed a step; restored as of an older step) are read again from the
  // job's checkpoint of step_id - 1; failing that they start from zero (an
  // error log, counted as stale restores and as resets). Checked when a
  // step stages rather than when the trainer asks, because a retry of a
  // committed step stages nothing.
  void CheckMomentumStep(int64_t step_id);
  // The worker took `committed` as its last committed step from its
  // trainer's step record (MomentumCheckpoints::Adopted).
  void AdoptCommitted(int64_t committed) { checkpoints_.Adopted(committed); }
  // The step the momentum restored from a checkpoint is as of (-1: none).
  int64_t restored_step() const { return checkpoints_.restored_step(); }

  // ---- The handover (momentum_handover.h).
  //
  // Runs the installed version's handover over `transport` (a new one of
  // that version: the first on it does the bookkeeping, later ones only
  // repeat the messages), with `control` (device memory of at least
  // ControlChannel's size) for its control messages; items whose previous
  // owner is gone come from the job's checkpoints as of the newest step
  // any rank committed. `last_committed` is this worker's. Runs the
  // transport I/O without the store's lock. The transport's error with
  // *transport_ok false (rebuild the transport; the handover runs again);
  // FAILED_PRECONDITION naming the first matrix whose momentum is lost,
  // which handover_failed() then answers for the rest of the version.
  absl::Status HandOver(transport::Transport& transport,
                        kernels::FloatBuffer* control, int64_t last_committed,
                        absl::Duration timeout, bool* transport_ok);
  // The installed version's failed handover (lost momentum); OK otherwise.
  absl::Status handover_failed() const;

  // ---- Matrices that restarted from zero (their momentum was lost and
  // the job allows that, or a restore was of another step).
  //
  // Those since the last call (a step's response reports them).
  int64_t TakeResets();
  // Those since the store was made. Never waits.
  int64_t resets_total() const { return resets_total_.load(); }

 private:
  // The owned slot of (matrix, expert), NOT_FOUND naming it otherwise.
  absl::StatusOr<ItemSlot> OwnedSlot(const std::string& matrix,
                                     int64_t expert) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status NoPlan() const;
  // Every owned expert (that holds no momentum, with `missing_only`).
  std::vector<MomentumCheckpoints::Expert> Owned(bool missing_only) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The checkpoint's momentum of (matrix, expert) into `slot` for the
  // handover, as of `step`: NOT_FOUND when none of that step.
  absl::Status MomentumFromCheckpoint(
      std::optional<absl::StatusOr<CheckpointCatalog>>& catalog, int matrix,
      int64_t expert, float* slot, int64_t step, int64_t last_committed);

  const std::string worker_id_;
  kernels::DeviceOps* const ops_;
  mutable absl::Mutex mu_;
  std::unique_ptr<MomentumStacks> stacks_ ABSL_GUARDED_BY(mu_);
  int64_t installs_ ABSL_GUARDED_BY(mu_) = 0;
  // The previous version's items, for the handover.
  PreviousOwnership previous_ ABSL_GUARDED_BY(mu_);
  // The version whose handover ran here (-1: none), its failure (lost
  // momentum), and the items owned here it left lost.
  int64_t handed_over_version_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Status handover_failed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int, int64_t>> lost_items_ ABSL_GUARDED_BY(mu_);
  int64_t resets_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> resets_total_{0};
  MomentumCheckpoints checkpoints_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_MOMENTUM_STORE_H_
