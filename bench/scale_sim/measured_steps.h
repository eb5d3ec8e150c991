// Measured multi-GPU step times to validate the simulation against: the
// JSON lines bench/step_gpu prints, one object per line, of which those
// with "what": "muonps_step_<N>gpu" count, e.g.
//   {"what": "muonps_step_4gpu", "ms": 61.2, "layout": "unreduced",
//    "predicted_ms": 58.0}
// "layout" is optional (bench/step_gpu's one-GPU run registers replicated
// matrices and prints none: replicated is assumed); "predicted_ms" is the
// bench's own per-worker prediction, passed through when present. Other
// "what" values (muonps_step_1gpu_2workers, muonps_ns_all, ...), blank
// lines and lines starting with '#' are skipped. Functions are thread-safe.
#ifndef MUONPS_BENCH_SCALE_SIM_MEASURED_STEPS_H_
#define MUONPS_BENCH_SCALE_SIM_MEASURED_STEPS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace bench {

struct MeasuredStep {
  int gpus = 0;
  scheduler::Layout layout = scheduler::Layout::kReplicated;
  double ms = 0;
  std::optional<double> predicted_ms;
  int line = 0;  // 1-based, in the file
};

// INVALID_ARGUMENT naming "--measured line N" and the field for a line that
// is not a JSON object, a counted line whose "ms" is missing or not > 0, a
// GPU count < 1 or an unknown layout.
absl::StatusOr<std::vector<MeasuredStep>> ParseMeasuredSteps(
    absl::string_view text);

// Reads `path` and parses it; INVALID_ARGUMENT naming --measured when it
// cannot be read.
absl::StatusOr<std::vector<MeasuredStep>> LoadMeasuredSteps(
    const std::string& path);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_SCALE_SIM_MEASURED_STEPS_H_
