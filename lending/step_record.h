// The step record: 64 bytes of memory a trainer lends its worker beside its
// buffers, where the worker records which steps the trainer's parameters
// hold. It lives in the trainer's memory so that it outlives the worker: a
// worker that restarts (kill -9, OOM, a node's drain) reads it when the
// trainer attaches again and knows what its predecessor applied, instead of
// nothing. One format for the client that lends it (zero-filled) and the
// worker that writes it.
//
// Four 64-bit words, each a step id + 1 (0: none) except the instance:
//   applied   the last step whose updates are wholly in the parameters
//   applying  the last step whose updates started to be written (equal to
//             applied once they are all written: more means the writing
//             stopped part-way, and the parameters hold part of that step)
//   decided   the highest step this trainer's worker, as rank 0, decided to
//             commit (recorded before anyone is told, so the decision
//             outlives it)
//   decider   the instance (step_protocol.h) of the last worker that opened
//             a step as rank 0 with this trainer, recorded before anyone
//             hears of the step: a step that instance opened above
//             `decided` was never decided to commit
// The worker writes each word in its stream's order (host memory: at once;
// CUDA: a stream memory operation), so a word is never ahead of the work
// it describes. Plain data; thread-compatible.
#ifndef MUONPS_LENDING_STEP_RECORD_H_
#define MUONPS_LENDING_STEP_RECORD_H_

#include <cstddef>
#include <cstdint>

namespace muonps {

constexpr size_t kStepRecordBytes = 64;

// The words, by index.
enum class StepRecordWord : int {
  kApplied = 0,
  kApplying = 1,
  kDecided = 2,
  kDecider = 3,
};

// The record as read, steps as step ids (-1: none).
struct StepRecord {
  int64_t applied = -1;
  int64_t applying = -1;
  int64_t decided = -1;
  uint64_t decider = 0;

  // The step whose writing stopped part-way, or -1.
  int64_t torn() const { return applying > applied ? applying : -1; }
};

// The words of a record (kStepRecordBytes, 8-byte aligned) as a StepRecord.
StepRecord StepRecordFromWords(const uint64_t* words);
// The value a step id is stored as.
inline uint64_t StepRecordValue(int64_t step_id) {
  return static_cast<uint64_t>(step_id + 1);
}

}  // namespace muonps

#endif  // MUONPS_LENDING_STEP_RECORD_H_
