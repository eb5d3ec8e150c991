// Measured Newton-Schulz times that a worker reports for its GPU (or CPU),
// and the text format they travel in.
//
// Format: one JSON object per line; blank lines and lines starting with '#'
// are ignored. A measurement line is
//   {"rows": 4096, "cols": 14336, "algorithm": "gram", "batch": 8,
//    "seconds": 0.0123}
// meaning: orthogonalizing a stack of `batch` rows x cols matrices with
// `algorithm` (ns5 | gram, 5 steps) took `seconds` in all. Orientation does
// not matter (NS runs on the wide side), so 14336 x 4096 finds the line
// above. A line {"device": "NVIDIA H200"} names the device. Several lines
// for one (shape, algorithm) at different batch sizes let the cost model
// interpolate. A CostTable is immutable once parsed; safe to share.
#ifndef MUONPS_SCHEDULER_COST_TABLE_H_
#define MUONPS_SCHEDULER_COST_TABLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "newton_schulz/options.h"

namespace muonps {
namespace scheduler {

class CostTable {
 public:
  // (batch, seconds) points, sorted by batch, batches distinct.
  using Curve = std::vector<std::pair<int64_t, double>>;

  // Parses the format above. INVALID_ARGUMENT naming "line N" and the field
  // for malformed lines, non-positive numbers or unknown algorithms;
  // ALREADY_EXISTS naming the line for a second line with the same (shape,
  // algorithm, batch).
  static absl::StatusOr<CostTable> Parse(absl::string_view text);

  // Adds one measurement (same rules as a parsed line).
  absl::Status Add(int64_t rows, int64_t cols, NsAlgorithm algorithm,
                   int64_t batch, double seconds);

  // The measured curve for a shape and algorithm, or nullptr.
  const Curve* Find(int64_t rows, int64_t cols, NsAlgorithm algorithm) const;

  const std::string& device() const { return device_; }
  bool empty() const { return curves_.empty(); }

  // The table in the text format, one line per measurement, sorted.
  std::string Serialize() const;

  // The same device and measurements (two workers' tables parsed apart).
  friend bool operator==(const CostTable& a, const CostTable& b) {
    return a.device_ == b.device_ && a.curves_ == b.curves_;
  }

 private:
  using Key = std::tuple<int64_t, int64_t, int>;  // (min dim, max dim, alg)
  std::string device_;
  std::map<Key, Curve> curves_;
};

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_COST_TABLE_H_
