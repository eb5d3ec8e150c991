// A worker's on-disk checkpoints: the momentum of the matrices it owns, at
// the step ids the job asks for. Each checkpoint is two files in one
// directory, named by step id so that several coexist:
//
//   ckpt-<step, 20 digits>.data      the tensors' fp32 bytes, back to back
//   ckpt-<step, 20 digits>.manifest  what is where (checkpoint_manifest.h)
//
// WriteCheckpoint is crash-safe: it writes each file under a temporary name
// (".tmp-" prefix), fsyncs it and renames it into place, data first and
// manifest last, then fsyncs the directory. A manifest therefore never names
// data that is not complete, and a crash at any point leaves the previous
// checkpoints loadable; LoadLatestCheckpoint ignores temporaries and skips
// torn or corrupt checkpoints. Older checkpoints are pruned only after the
// new one is durable.
//
// Thread-safety: one writer per directory at a time (the worker's own); any
// number of concurrent loaders are safe, also alongside the writer.
#ifndef MUONPS_SERVER_WORKER_CHECKPOINT_STORE_H_
#define MUONPS_SERVER_WORKER_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/worker/checkpoint_manifest.h"

namespace muonps {

// One tensor to save; `values` must hold rows * cols floats, row-major, and
// stay valid for the duration of the WriteCheckpoint call.
struct CheckpointTensorValues {
  std::string name;
  int32_t expert = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  absl::Span<const float> values;
};

struct CheckpointWriteOptions {
  // Checkpoints kept in the directory, the new one included; must be >= 1.
  int keep_last = 2;
  // Called between the steps of the protocol with the step's name
  // ("data_written", "data_synced", ...). Tests kill the process there to
  // prove that every crash point leaves a loadable directory; production
  // leaves it empty.
  std::function<void(absl::string_view protocol_step)> crash_hook;
};

// Writes checkpoint `step` of worker `worker_id` under plan `plan_version`
// into `dir` (which must exist). It first removes the temporaries of
// earlier crashed writes, and once the new checkpoint is durable, the data
// files whose manifest never landed and the checkpoints beyond
// options.keep_last (the new one is always kept, then the newest). On success
// returns the manifest written, with offsets, lengths and CRC32Cs filled
// in. Returns INVALID_ARGUMENT naming the tensor or field when the input is
// malformed (empty or duplicate (name, expert), shape <= 0, values not
// rows * cols, step < 0, keep_last < 1), ALREADY_EXISTS when `dir` holds a
// manifest for `step` already (checkpoints are never rewritten in place),
// and INTERNAL naming the file and errno when the filesystem fails; on
// failure the earlier checkpoints stay untouched.
absl::StatusOr<CheckpointManifest> WriteCheckpoint(
    const std::string& dir, int64_t step, int64_t plan_version,
    const std::string& worker_id,
    const std::vector<CheckpointTensorValues>& tensors,
    const CheckpointWriteOptions& options = {});

// A checkpoint read back whole: tensors[i] holds the values of
// manifest.tensors[i]. The caller owns it.
struct LoadedCheckpoint {
  CheckpointManifest manifest;
  std::vector<std::vector<float>> tensors;
};

// Loads checkpoint `step` from `dir`, verifying the manifest and every
// tensor's length and CRC32C. Returns NOT_FOUND when no manifest for `step`
// exists, and DATA_LOSS naming the file and what is wrong when the manifest
// or data is torn, corrupt, missing or inconsistent with its file name.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& dir,
                                                int64_t step);

// Loads the newest checkpoint in `dir` that LoadCheckpoint accepts; each
// newer one it rejects is logged at warn with the reason and skipped.
// Returns NOT_FOUND naming `dir` when none is complete (saying how many
// were skipped), INTERNAL when `dir` cannot be listed.
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir);

// Removes checkpoint `step` from `dir` if it is there: its manifest first
// (the directory synced, so no manifest outlives its data), then its data.
// INTERNAL naming the file and errno when the filesystem fails.
absl::Status RemoveCheckpoint(const std::string& dir, int64_t step);

// The step ids that have a manifest file in `dir`, ascending, whether or not
// their data is intact. INTERNAL when `dir` cannot be listed.
absl::StatusOr<std::vector<int64_t>> ListCheckpointSteps(
    const std::string& dir);

}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_CHECKPOINT_STORE_H_
