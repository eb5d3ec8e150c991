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

// One worker's step timeline (see above). Times in ms; a kind of mark the
// line lacks reads 0.
struct MeasuredTimeline {
  int gpus = 0;
  // Workers sharing the `gpus` ("workers", bench/step_gpu's workers that
  // share one GPU; 1 where the line has none): only a timeline of one
  // worker per GPU is a muonps_step_<N>gpu step's.
  int workers = 1;
  scheduler::Layout layout = scheduler::Layout::kReplicated;
  int rank = 0;
  double agreed_ms = 0, staged_ms = 0, committed_ms = 0;  // host, from 0
  double gradients_landed_ms = 0;  // the last "to_owners" mark
  double compute_end_ms = 0;       // the last "compute" mark
  double updates_landed_ms = 0;    // the last "from_owners" mark
  std::vector<int> stacks;         // "compute" indices, in mark order
  int line = 0;
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

// The muonps_step_timeline lines; INVALID_ARGUMENT naming "--measured line
// N" and the field for one without gpus >= 1, rank >= 0, host_ms or marks
// of [string, number, number], or with workers < 1 or an unknown layout
// (other lines are
// skipped as by ParseMeasuredSteps).
absl::StatusOr<std::vector<MeasuredTimeline>> ParseMeasuredTimelines(
    absl::string_view text);
absl::StatusOr<std::vector<MeasuredTimeline>> LoadMeasuredTimelines(
    const std::string& path);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_SCALE_SIM_MEASURED_STEPS_H_
