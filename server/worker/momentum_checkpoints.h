// MomentumCheckpoints: the checkpoint side of a worker's owned momentum,
// held by its MomentumStore. It knows when a committed step is due for a
// checkpoint and hands the store's snapshots to the CheckpointWriter, which
// writes them in the background; it reads the job's checkpoints for a
// restore and decides what may be installed (checkpoint_restore.h's rule:
// momentum as of the job's step, never another), keeping a record of what
// each lookup found, which the handover reuses; it counts restores
// (muonps_worker_momentum_restores_total{result="restored"|"stale"|
// "missing"}) and logs them. It never touches the device: the store copies
// what it finds into its stacks, and its snapshots out of them.
//
// Thread-safe. Its lock is a leaf (the store may hold its own when it
// calls) and is held across no disk I/O. Not copyable.
#ifndef MUONPS_SERVER_WORKER_MOMENTUM_CHECKPOINTS_H_
#define MUONPS_SERVER_WORKER_MOMENTUM_CHECKPOINTS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics.h"
#include "scheduler/plan_types.h"
#include "server/worker/checkpoint_restore.h"
#include "server/worker/checkpoint_writer.h"
#include "server/worker/momentum_stacks.h"

namespace muonps {
namespace worker {

class MomentumCheckpoints {
 public:
  // One owned expert, as a restore looks it up.
  struct Expert {
    int matrix = 0;  // job index
    int64_t expert = 0;
    scheduler::MatrixSpec spec;
  };
  // Its momentum as a checkpoint holds it (host memory, rows x cols).
  struct Found {
    Expert expert;
    std::vector<float> values;
  };
  // Checkpoints go to <checkpoint_dir>/`worker_id`/; nothing is written or
  // restored before Enable.
  explicit MomentumCheckpoints(std::string worker_id);
  MomentumCheckpoints(const MomentumCheckpoints&) = delete;
  MomentumCheckpoints& operator=(const MomentumCheckpoints&) = delete;
  // Waits for the checkpoint being written, if any.
  ~MomentumCheckpoints();

  // Call once, before any other call; `metrics` (may be null) must outlive
  // this object.
  void Enable(MetricsRegistry* metrics);
  bool enabled() const { return writer_ != nullptr; }

  // ---- Writing.
  //
  // Asks for a checkpoint of the next step staged. FAILED_PRECONDITION
  // naming job.checkpoint_dir when not enabled or `dir` (the job's) is
  // empty. Returns the last step written (-1: none).
  absl::StatusOr<int64_t> Request(const std::string& dir);
  // Whether step `step`, staged in plan version `version`, is due for a
  // checkpoint into `dir`: not written yet for that version, and a
  // multiple of `every` (> 0) or asked for.
  bool Due(const std::string& dir, int64_t every, int64_t step,
           int64_t version) const;
  // Writes `snapshot` durably and returns the write's status (call with no
  // lock held; waits first for a write still in progress). On success the
  // step is not due again in its version, and the request is met. A
  // checkpoint of the same step already on disk is replaced: a redo of a
  // step that did not commit computes the same momentum, but the plan may
  // have given this worker other matrices meanwhile.
  absl::Status Write(CheckpointSnapshot snapshot);
  // The last step whose checkpoint was written durably (-1: none).
  int64_t last_written() const;
  // Waits for the checkpoint being written, if any; its status.
  absl::Status Wait();

  // ---- Restoring.
  //
  // The momentum of `missing` (owned in version `version`, holding none)
  // from `dir`'s checkpoints, of those whose newest checkpoint is of the
  // reference step (set in *reference): `committed` (this worker's last
  // committed step), or for a worker that has committed none the newest
  // checkpoint's step. The others are left out (a warn log naming both
  // steps; counted stale or missing) and every lookup is recorded for the
  // handover. INTERNAL when `dir` cannot be listed.
  absl::StatusOr<std::vector<Found>> FindMissing(const std::string& dir,
                                                 int64_t version,
                                                 std::vector<Expert> missing,
                                                 int64_t committed,
                                                 int64_t* reference);
  // The store installed `count` of FindMissing's as of `reference`: they
  // count as restored (restored_step()), and for a worker that has
  // committed nothing its trainer must resume from there (the store's
  // MomentumStack::as_of says so to the first step staged).
  void RestoredMissing(const std::string& dir, int64_t version,
                       int64_t reference, int64_t committed, int64_t count);
  // Checkpoint `step` of `dir` for every expert in `owned` (of version
  // `version`), all read and checked. INVALID_ARGUMENT naming
  // `checkpoint_dir` or `step` when malformed, NOT_FOUND naming the first
  // expert the checkpoint lacks, INVALID_ARGUMENT for a shape mismatch;
  // INTERNAL when `dir` cannot be listed.
  absl::StatusOr<CheckedMomentum> Read(const std::string& dir, int64_t step,
                                       int64_t version,
                                       const std::vector<Expert>& owned) const;
  // The store wrote `count` experts of `checked` (from a checkpoint): they
  // count as restored as of its step, replacing every earlier lookup.
  void Installed(const CheckedMomentum& checked, int64_t count);
  // `count` restored experts were dropped (counted as stale restores).
  void Dropped(int64_t count);
  // The worker took `committed` as its last committed step without
  // committing anything (its trainer's step record said so): the lookups
  // made while it had committed nothing stand for that step too.
  void Adopted(int64_t committed);
  // The momentum of `lost` (an item whose previous owner is gone, owned
  // here) as of `step` (the newest step any rank committed), for the
  // handover: nullopt when a lookup since the last commit here already
  // installed it (`has_momentum`: the slot still holds some); from
  // `catalog` (`dir`'s checkpoints, loaded at the first call) otherwise.
  // NOT_FOUND when no checkpoint holds it as of `step`.
  absl::StatusOr<std::optional<std::vector<float>>> ForHandover(
      std::optional<absl::StatusOr<CheckpointCatalog>>& catalog,
      const std::string& dir, const Expert& lost, int64_t step,
      int64_t committed, bool has_momentum);
  // Counts and logs ForHandover's item installed in version `version`.
  void HandedOverFromCheckpoint(const Expert& lost, int64_t step,
                                int64_t version);
  // The step the momentum restored from a checkpoint is as of (-1: none).
  int64_t restored_step() const { return restored_step_.load(); }

 private:
  void Count(int64_t restored, int64_t stale, int64_t missing);

  const std::string worker_id_;
  // Set once by Enable, before use.
  std::unique_ptr<CheckpointWriter> writer_;
  Counter* restores_ = nullptr;
  mutable absl::Mutex mu_;
  // The last step written, and the plan version it was staged in.
  int64_t written_step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t written_version_ ABSL_GUARDED_BY(mu_) = -1;
  bool requested_ ABSL_GUARDED_BY(mu_) = false;
  // The step S of a restore whose S + 1 no step has staged yet (-1:
  // none); only while no step was staged here.
  // What FindMissing found for each (matrix, expert) it looked up: the
  // step it looked for, the last step committed here then, whether that
  // step's momentum was installed, and else why not. Until the next
  // commit, the handover's lost items take that answer instead of reading
  // (and counting) the checkpoint again when they need the same step and
  // the slot still holds momentum (the record survives versions with no
  // step between them; Installed clears it).
  struct Lookup {
    int64_t step = -1;
    int64_t committed = -1;
    bool installed = false;
    std::string why_not;
  };
  std::map<std::pair<int, int64_t>, Lookup> lookups_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> restored_step_{-1};
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_MOMENTUM_CHECKPOINTS_H_
