// The manifest of one worker checkpoint: which step and plan it belongs to,
// whose it is, and where each tensor lies in the checkpoint's data file,
// with the CRC32C that proves the bytes there are the ones written.
//
// The manifest is a small binary file (all integers little-endian):
//
//   "MPSCKPT1"                     magic, 8 bytes
//   u32 format_version             kCheckpointFormatVersion
//   i64 step, i64 plan_version
//   u32 len, bytes                 worker id
//   u64 data_bytes                 exact size of the data file
//   u32 tensor_count
//   per tensor: u32 len, bytes name; i32 expert; i64 rows; i64 cols;
//               u32 dtype; u64 offset; u64 length; u32 crc32c
//   u32 crc32c of every byte above
//
// ParseCheckpointManifest reads bytes from disk, so it trusts none of them:
// every length, count and offset is bounded and checked before use, and any
// input yields a value or an error naming the bad field, never a crash.
//
// Thread-safety: the functions keep no state and are safe to call
// concurrently.
#ifndef MUONPS_SERVER_WORKER_CHECKPOINT_MANIFEST_H_
#define MUONPS_SERVER_WORKER_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonps {

inline constexpr uint32_t kCheckpointFormatVersion = 1;
// Bounds a hostile manifest cannot talk the reader past.
inline constexpr uint32_t kMaxCheckpointTensors = 1 << 20;
inline constexpr uint32_t kMaxCheckpointNameBytes = 4096;

// Element type of a saved tensor. Only fp32 momentum is saved today; the
// field exists so that a later bf16 checkpoint is refused, not misread.
enum class CheckpointDtype : uint32_t { kFp32 = 1 };

// One tensor of a checkpoint: the momentum of one expert of one matrix.
struct CheckpointTensor {
  std::string name;
  int32_t expert = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  CheckpointDtype dtype = CheckpointDtype::kFp32;
  // Where its bytes lie in the data file, and their CRC32C.
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t crc32c = 0;
};

struct CheckpointManifest {
  int64_t step = 0;
  int64_t plan_version = 0;
  // The worker that owned these tensors at `step`.
  std::string worker_id;
  // Size of the data file; a longer or shorter file is corrupt.
  uint64_t data_bytes = 0;
  std::vector<CheckpointTensor> tensors;
};

// CRC32C (Castagnoli) of `bytes`, continuing from `crc` (0 to start).
uint32_t Crc32c(absl::string_view bytes, uint32_t crc = 0);

// The manifest's bytes in the format above. `manifest` must satisfy what
// ParseCheckpointManifest checks (WriteCheckpoint builds only such).
std::string SerializeCheckpointManifest(const CheckpointManifest& manifest);

// Parses and validates `bytes`. Returns DATA_LOSS naming the field when the
// bytes end early, carry extra bytes or fail the trailing CRC, and
// INVALID_ARGUMENT naming the field when a value is out of range: bad magic
// or version, a count or name past the bounds above, rows or cols <= 0, an
// unknown dtype, a length other than rows*cols*4, or a tensor reaching past
// data_bytes (all arithmetic overflow-checked).
absl::StatusOr<CheckpointManifest> ParseCheckpointManifest(
    absl::string_view bytes);

}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_CHECKPOINT_MANIFEST_H_
