// CheckpointWriter: writes a worker's momentum checkpoints on a thread of
// its own. MomentumStore copies a step's staged momentum to host memory
// before the step's vote (the step ids JobSpec.checkpoint_every names, or
// the next one after a Worker.Checkpoint call) and hands it to Submit,
// then waits for it (WaitIdle); the writer's thread writes it with
// WriteCheckpoint (checkpoint_store.h: temporary file, fsync, rename, fsync
// of the directory, manifest last) into <checkpoint_dir>/<worker_id>/,
// keeping the newest two. A checkpoint of the same step already there is
// removed first (RemoveCheckpoint): a redo of a step that did not commit.
//
// One write at a time, and none is lost: a snapshot submitted while the
// previous one is still being written waits for it (logged at warn with
// the wait, counted as result="delayed"), so at most two snapshots are in
// memory and a disk slower than the checkpoint interval slows the steps
// that checkpoint rather than dropping checkpoints a restore or a state
// dict relies on. Results are counted in
// muonps_worker_checkpoints_total{result="written"|"failed"|"delayed"} and
// logged (info when written, error naming the file and errno on failure).
//
// Thread-safe. Not copyable. The destructor waits for a write in progress.
#ifndef MUONPS_SERVER_WORKER_CHECKPOINT_WRITER_H_
#define MUONPS_SERVER_WORKER_CHECKPOINT_WRITER_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace muonps {
namespace worker {

// The momentum of one owned expert, copied to host memory.
struct SnapshotTensor {
  std::string name;
  int32_t expert = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> values;  // rows * cols
};

// What one checkpoint holds, owned by the writer once submitted.
struct CheckpointSnapshot {
  std::string checkpoint_dir;  // JobSpec.checkpoint_dir
  int64_t step = 0;
  int64_t plan_version = 0;
  std::vector<SnapshotTensor> tensors;
};

class CheckpointWriter {
 public:
  // Writes into <checkpoint_dir>/`worker_id`/. `metrics` (may be null)
  // must outlive the writer.
  CheckpointWriter(std::string worker_id, MetricsRegistry* metrics);
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  ~CheckpointWriter();

  // Hands `snapshot` to the writer's thread and returns how long it waited
  // for the previous write to finish (zero when none was in progress).
  absl::Duration Submit(CheckpointSnapshot snapshot);

  // Waits until no write is in progress; returns the last write's status
  // (OK when none failed). For shutdown and tests.
  absl::Status WaitIdle();

  // The step of the last checkpoint written durably (-1: none yet).
  int64_t last_written() const { return last_written_.load(); }

 private:
  void Loop();
  absl::Status Write(const CheckpointSnapshot& snapshot);

  const std::string worker_id_;
  Counter* results_;
  std::atomic<int64_t> last_written_{-1};
  absl::Mutex mu_;
  std::optional<CheckpointSnapshot> pending_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status last_status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_CHECKPOINT_WRITER_H_
