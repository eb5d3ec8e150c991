// What a trainer rank of the example saves after every answered step, so
// that a trainer killed at any moment (kill -9, an OOM, a node's drain)
// resumes as a user's loop does: its parameters, the AdamW moments and step
// count its client holds, and the step they are as of (Client::ResumeAfter).
// The file is replaced whole: written beside it, fsynced, renamed over it,
// and the directory fsynced, so a kill leaves the old state or the new one.
// Plain data and free functions; thread-compatible.
#ifndef MUONPS_EXAMPLES_TRAINER_TRAINER_STATE_H_
#define MUONPS_EXAMPLES_TRAINER_TRAINER_STATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace example {

struct TrainerState {
  int64_t step = -1;  // the parameters hold every step up to this one
  int64_t adamw_steps = 0;
  double initial_loss = 0;
  int64_t retries = 0;  // failed step attempts so far
  int64_t resumes = 0;  // times this rank resumed from the file
  std::vector<float> params;
  // By AdamW tensor, in declaration order.
  std::vector<std::vector<float>> exp_avg;
  std::vector<std::vector<float>> exp_avg_sq;
};

// Replaces `path` with `state`, durably.
absl::Status SaveTrainerState(const std::string& path,
                              const TrainerState& state);
// The state at `path`; nullopt when there is no file. DATA_LOSS naming
// the path for a file that is not one SaveTrainerState wrote whole.
absl::StatusOr<std::optional<TrainerState>> LoadTrainerState(
    const std::string& path);

}  // namespace example
}  // namespace muonps

#endif  // MUONPS_EXAMPLES_TRAINER_TRAINER_STATE_H_
