// Restoring momentum from the checkpoints of a job's checkpoint directory
// (JobSpec.checkpoint_dir): every worker writes the momentum it owns into
// <checkpoint_dir>/<worker_id>/ (checkpoint_writer.h), so after a restart or
// a re-plan the momentum of a matrix may sit in any worker's directory.
//
// CheckpointCatalog reads the newest checkpoint of every worker directory
// that LoadLatestCheckpoint accepts (every tensor's CRC32C verified; torn
// and corrupt ones are skipped with a warn log) and answers, per (matrix,
// expert), with the tensor from the newest of them that holds it.
//
// Which step the momentum is as of (the rule): a tensor restored from a
// checkpoint of step S is the momentum after step S. It is only correct if
// the trainer's parameters are those after step S too, that is, if the job
// resumes from S (its next step is S + 1). Restore reports S so that the
// caller can compare it with the job's last committed step and say so
// (StepEngine logs every restore whose S differs, counts it as stale and
// shows S in WorkerStatus.restored_step); it never guesses.
//
// Thread-compatible: a catalog is read-only once built.
#ifndef MUONPS_SERVER_WORKER_CHECKPOINT_RESTORE_H_
#define MUONPS_SERVER_WORKER_CHECKPOINT_RESTORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/worker/checkpoint_store.h"

namespace muonps {
namespace worker {

class CheckpointCatalog {
 public:
  // Reads `dir`'s worker directories: each one's newest verified
  // checkpoint, or with `step` >= 0 its checkpoint of that step (a
  // directory without one is skipped; a corrupt one is skipped with a warn
  // log). A missing `dir`, or one with no such checkpoint, gives an empty
  // catalog (OK); INTERNAL naming the path when it cannot be listed.
  static absl::StatusOr<CheckpointCatalog> Load(const std::string& dir,
                                                int64_t step = -1);

  // Copies the momentum of expert `expert` of `matrix` (rows x cols fp32,
  // row-major) into `dst` (host memory, rows * cols floats) and returns
  // the step it is as of. NOT_FOUND naming the matrix when no checkpoint
  // holds it; INVALID_ARGUMENT naming it when the checkpoint's shape is
  // not rows x cols (the job changed).
  absl::StatusOr<int64_t> Restore(const std::string& matrix, int64_t expert,
                                  int64_t rows, int64_t cols, float* dst) const;

  // The newest step of any checkpoint read (-1: none).
  int64_t newest_step() const { return newest_step_; }
  bool empty() const { return checkpoints_.empty(); }

 private:
  std::vector<LoadedCheckpoint> checkpoints_;
  // (name, expert) -> (checkpoint index, tensor index), newest step wins.
  std::map<std::pair<std::string, int64_t>, std::pair<size_t, size_t>> where_;
  int64_t newest_step_ = -1;
};

// One-shot form for callers that restore a single tensor (the handover on
// re-plan): loads the catalog of `dir` and restores (matrix, expert) into
// `dst`. Returns the step it is as of, or -1 when no checkpoint holds it
// (nothing written to `dst`); errors as Load's and Restore's.
absl::StatusOr<int64_t> RestoreMomentumFromCheckpoint(const std::string& dir,
                                                      const std::string& matrix,
                                                      int64_t expert,
                                                      int64_t rows,
                                                      int64_t cols, float* dst);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_CHECKPOINT_RESTORE_H_
