// The autotuner: measures how long a MuonKernels backend takes to
// orthogonalize stacks of same-shape matrices with NS5 and with Gram NS, at
// several batch sizes, and turns the measurements into the cost table that
// workers report to the planner (scheduler/cost_table.h's format) and into a
// per-shape summary: which algorithm wins, and which batch sizes the planner
// will run as several smaller calls (by the same rule: scheduler's
// BatchSplitter).
//
// Generic over the backend: the kernels and the kernels::DeviceOps of their
// device (memory, copies, and the stream everything runs on) are passed in,
// so it runs, and is tested, on the CPU backend with host memory exactly as
// it runs on the GPU. Functions here are thread-compatible (the kernels and
// ops are used by the calling thread only).
#ifndef MUONPS_TOOLS_AUTOTUNE_AUTOTUNE_H_
#define MUONPS_TOOLS_AUTOTUNE_AUTOTUNE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/device_ops.h"
#include "kernels/muon_kernels.h"
#include "newton_schulz/options.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace autotune {

struct MatrixShape {
  int64_t rows = 0;
  int64_t cols = 0;
};

// Parses "4096x4096,1024x4096": comma-separated ROWSxCOLS, each dimension in
// [1, 1e6]. INVALID_ARGUMENT naming `shapes` and the bad entry otherwise.
absl::StatusOr<std::vector<MatrixShape>> ParseShapes(absl::string_view text);

// Parses "1,2,4,8,16": comma-separated batch sizes in [1, 1e5].
// INVALID_ARGUMENT naming `batches` and the bad entry otherwise.
absl::StatusOr<std::vector<int64_t>> ParseBatches(absl::string_view text);

// The distinct Llama-3-8B matrix shapes up to orientation: q and o
// (4096x4096), k and v (1024x4096), gate and up (14336x4096; down,
// 4096x14336, is the same cost-table entry).
std::vector<MatrixShape> Llama3_8BShapes();

struct AutotuneOptions {
  std::vector<MatrixShape> shapes;
  // Batch sizes to measure, each shape at each size.
  std::vector<int64_t> batches = {1, 2, 4, 8, 16};
  // Untimed calls before the timed ones (module load, workspaces, caches).
  int warmup = 1;
  // Timed repeats; the median is kept.
  int repeats = 5;
  // Each repeat runs as many calls back to back as fill this long (timed
  // by one more untimed call after the warmup): a step keeps
  // the device busy for tens of milliseconds, and a short call after idle
  // runs at clocks a power-limited GPU does not hold (an H200 timed 16
  // single 4096 x 4096 calls 10% faster than one call of 16 that way,
  // and 10% slower back to back). 0: one call per repeat.
  double sustain_seconds = 0.05;
  // Options of every call except `algorithm`, which is set per measurement.
  // The cost table's format fixes 5 steps.
  NewtonSchulzOptions ns;
};

// INVALID_ARGUMENT naming the field unless there is at least one shape, no
// two shapes equal up to orientation (the cost table does not tell them
// apart), batches are distinct and >= 1, warmup >= 0, 1 <= repeats <= 1000,
// 0 <= sustain_seconds <= 10, and `ns` is valid with 5 steps.
absl::Status ValidateAutotuneOptions(const AutotuneOptions& options);

struct Measurement {
  MatrixShape shape;
  NsAlgorithm algorithm = NsAlgorithm::kNs5;
  int64_t batch = 0;
  // Median over the repeats of the seconds per Orthogonalize call on the
  // whole stack, each repeat's calls back to back (sustain_seconds).
  double seconds = 0;
};

// Receives one human-readable progress line per measurement.
using ProgressFn = std::function<void(absl::string_view)>;

// Measures `shape` with both algorithms at every batch size of `options`
// (which must be valid): allocates an input and an output stack of the
// largest batch with `ops` (on the kernels' device), fills the input with
// uniform random values in [-1, 1) (never zeros, which can time faster than
// real data), and times kernels.Orthogonalize. Every copy, kernel call and
// synchronization runs on ops.stream(). Fails with the first error of the
// kernels or the ops, naming the measurement; `progress` may be null.
absl::StatusOr<std::vector<Measurement>> MeasureShape(
    kernels::MuonKernels& kernels, kernels::DeviceOps& ops,
    const MatrixShape& shape, const AutotuneOptions& options,
    const ProgressFn& progress);

// The measurements in scheduler/cost_table.h's format: a {"device": ...}
// line first, then one line per measurement. The result is checked to parse
// with scheduler::CostTable::Parse; INVALID_ARGUMENT or ALREADY_EXISTS from
// that check (e.g. a (shape, algorithm, batch) measured twice).
absl::StatusOr<std::string> CostTableText(
    absl::string_view device, absl::Span<const Measurement> measurements);

// A batch worth splitting: its best single call takes `seconds`; the calls
// `parts` (counts, largest first) with `algorithms` (one per part) take
// `split_seconds` in all.
struct BatchSplit {
  int64_t batch = 0;
  std::vector<int64_t> parts;
  std::vector<NsAlgorithm> algorithms;
  double seconds = 0;
  double split_seconds = 0;
};

struct ShapeSummary {
  MatrixShape shape;
  struct AtBatch {
    int64_t batch = 0;
    double ns5_seconds = 0;
    double gram_seconds = 0;
    NsAlgorithm winner = NsAlgorithm::kNs5;
  };
  std::vector<AtBatch> batches;  // ascending batch
  // The algorithm with the smaller total time over all batch sizes.
  NsAlgorithm winner = NsAlgorithm::kNs5;
  // Measured batch sizes that the planner would split: those whose best
  // split (scheduler::BatchSplitter over these measurements, interpolated
  // between the measured sizes as the planner does) is faster than the best
  // single call by more than scheduler::kSplitMargin; ascending.
  std::vector<BatchSplit> worth_splitting;
};

// Summarizes the measurements of one shape (both algorithms at each batch
// size, as MeasureShape returns them). INVALID_ARGUMENT naming
// `measurements` if they are empty, mix shapes, or miss an algorithm at
// some batch size; ALREADY_EXISTS naming it if one (algorithm, batch) is
// measured twice.
absl::StatusOr<ShapeSummary> Summarize(
    absl::Span<const Measurement> measurements);

// The summary as one JSON object: {"what": "autotune_shape", "rows", "cols",
// "winner", "batches": [{"batch", "ns5_seconds", "gram_seconds", "winner",
// "gram_speedup"}], "worth_splitting": [{"batch", "into", "algorithms",
// "seconds", "split_seconds", "speedup"}]}.
nlohmann::ordered_json ShapeSummaryJson(const ShapeSummary& summary);

}  // namespace autotune
}  // namespace muonps

#endif  // MUONPS_TOOLS_AUTOTUNE_AUTOTUNE_H_
