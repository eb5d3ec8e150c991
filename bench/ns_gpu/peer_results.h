// The PyTorch peers' figures that bench/ns_gpu/torch_peers.py measured in the
// same run (one JSON object per line, each with a "what"), looked up by name
// and shape so ns_gpu_bench can put ratios against them in its own lines.
//
// Immutable once loaded; safe to share between threads.
#ifndef MUONPS_BENCH_NS_GPU_PEER_RESULTS_H_
#define MUONPS_BENCH_NS_GPU_PEER_RESULTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace bench {

class PeerResults {
 public:
  // No peers: every lookup finds nothing.
  PeerResults() = default;

  // Parses JSON lines; blank lines are skipped. INVALID_ARGUMENT naming
  // "line N" for a line that is not a JSON object with a string "what".
  static absl::StatusOr<PeerResults> Parse(absl::string_view text);

  // Reads and parses `path`; NOT_FOUND naming the path if it cannot be read.
  static absl::StatusOr<PeerResults> Load(const std::string& path);

  // The first line with this `what` (and, when rows > 0, these rows, cols
  // and batch), or nullptr.
  const nlohmann::json* Find(absl::string_view what, int64_t rows = 0,
                             int64_t cols = 0, int64_t batch = 0) const;

  // Find(...)[key] when it is a number, else nullopt (e.g. a skipped peer).
  std::optional<double> Number(absl::string_view what, absl::string_view key,
                               int64_t rows = 0, int64_t cols = 0,
                               int64_t batch = 0) const;

 private:
  std::vector<nlohmann::json> lines_;
};

// numerator / denominator as JSON, or null when either is missing or the
// denominator is not positive: ratios against absent peers print as null.
nlohmann::json Ratio(std::optional<double> numerator,
                     std::optional<double> denominator);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_NS_GPU_PEER_RESULTS_H_
