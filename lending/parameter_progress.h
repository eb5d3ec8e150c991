// The parameters' progress word: one 64-bit word of a CUDA trainer's memory
// that its worker's stream advances as a step's updates land in the
// parameters, so that the trainer's next forward waits, on the device, for
// the layers it is about to read rather than for the whole step. One format
// for the client that lends it (zero-filled) and the worker that writes it.
//
// The word holds (step_id + 1) << 32 | written, where `written` counts the
// trainer's job matrices, in the order its attach request binds them, whose
// parameters hold the step's update: 0 once the step's AdamW means are in the
// lent gradients and the worker reads no gradient of the step any more,
// kAllMatrices once the step wrote all it will (committed, rejected or
// already applied). A stream waits for at least a value, which CUDA compares
// as the signed difference of the two, so the word may wrap past step ids of
// 2^32 - 1 without a wait going wrong. Plain functions; thread-safe.
#ifndef MUONPS_LENDING_PARAMETER_PROGRESS_H_
#define MUONPS_LENDING_PARAMETER_PROGRESS_H_

#include <cstdint>

namespace muonps {

// `written` for a step that wrote everything it will.
inline constexpr uint32_t kAllMatrices = 0xFFFFFFFFu;

// The word once step `step_id` has written the first `written` matrices.
inline uint64_t ParameterProgressValue(int64_t step_id, uint32_t written) {
  return (static_cast<uint64_t>(step_id + 1) << 32) | written;
}

}  // namespace muonps

#endif  // MUONPS_LENDING_PARAMETER_PROGRESS_H_
