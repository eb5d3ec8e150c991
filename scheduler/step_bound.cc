#include "scheduler/step_bound.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"

namespace muonps {
namespace scheduler {

StepBound::StepBound(const std::vector<MatrixSpec>& matrices,
                     const ClockSettings& settings,
                     const ScheduleOptions& options, int dedicated)
    : settings_(settings) {
  holds_ =
      dedicated == 0 && !matrices.empty() &&
      std::all_of(matrices.begin(), matrices.end(), [](const MatrixSpec& m) {
        return m.layout == Layout::kReplicated;
      });
  if (!holds_) return;
  // The commit as ClockStep adds it: every trainer applies every matrix.
  double applied = 0;
  for (const MatrixSpec& m : matrices) {
    applied += static_cast<double>(m.rows * m.cols * m.experts);
  }
  commit_seconds_ = settings.control_rounds_ms * 1e-3 +
                    applied * (2 * 4 + settings.update_bytes_per_element) /
                        settings.hbm_bytes_per_second;
  // The bucket bounds ChooseStepGrouping clocks (or the job's own).
  int64_t everything = 0;
  for (const MatrixSpec& m : matrices)
    everything += PayloadBytes(m) * m.experts;
  std::vector<int64_t> bounds;
  if (options.bucket_bytes > 0) {
    bounds.push_back(options.bucket_bytes);
  } else {
    constexpr int64_t kBase = int64_t{64} << 20;
    bounds.push_back(std::max(everything, kBase));
    for (const int64_t times : {64, 16, 4, 1}) {
      if (kBase * times < everything) bounds.push_back(kBase * times);
    }
  }
  // Gradients arrive from the last layer to the first, later matrices of a
  // layer first (StepScheduleCutter): where layers never fall with the
  // index, that is the reverse index order.
  const int count = static_cast<int>(matrices.size());
  std::vector<int32_t> arrival(count);
  std::iota(arrival.rbegin(), arrival.rend(), 0);
  bool by_index = true;
  for (int m = 1; m < count && by_index; ++m) {
    by_index = matrices[m - 1].layer <= matrices[m].layer;
  }
  if (!by_index) {
    std::sort(arrival.begin(), arrival.end(), [&](int32_t x, int32_t y) {
      return matrices[x].layer != matrices[y].layer
                 ? matrices[x].layer > matrices[y].layer
                 : x > y;
    });
  }
  // Cut as CutBuckets cuts: a bucket closes before it would pass the bound.
  for (const int64_t bound : bounds) {
    std::vector<BucketSum>& cut = cuts_.emplace_back();
    int64_t filled = 0;
    for (int i = 0; i < count; ++i) {
      const MatrixSpec& m = matrices[arrival[i]];
      const int64_t bytes = PayloadBytes(m) * m.experts;
      if (i == 0 || filled + bytes > bound) {
        cut.emplace_back();
        filled = 0;
      }
      filled += bytes;
      cut.back().messages += m.experts;
      cut.back().bytes +=
          static_cast<double>(m.rows * m.cols *
                              settings.update_bytes_per_element) *
          static_cast<double>(m.experts);
    }
  }
}

double StepBound::Seconds(const std::vector<int32_t>& ranks,
                          double compute_seconds) const {
  const std::vector<int32_t>& node = settings_.topology.node;
  if (!holds_ || ranks.size() < 2 || node.empty()) return 0;
  absl::flat_hash_map<int32_t, int> on_node;
  int g = 1;
  for (const int32_t r : ranks) g = std::max(g, ++on_node[node[r]]);
  if (on_node.size() < 2) return 0;  // one node: peer writes, not rings
  const LinkFigures& l = settings_.topology.links;
  const double n = static_cast<double>(ranks.size());
  double least = std::numeric_limits<double>::infinity();
  for (const std::vector<BucketSum>& cut : cuts_) {
    double phases = 0;
    double shortest = std::numeric_limits<double>::infinity();
    for (const BucketSum& b : cut) {
      // A ring broadcast: (g-1)/g of the bytes over NVLink, 1/g over each
      // member's NIC (Phase::Add).
      const double nvlink = b.bytes * (g - 1) / g / (l.nvlink_gbs * 1e9);
      const double nic = b.bytes / g / (l.inter_node_gbs * 1e9);
      const double seconds =
          static_cast<double>(b.messages) * l.latency_us * 1e-6 +
          (n - 1) * l.hop_latency_us * 1e-6 + std::max(nvlink, nic);
      phases += seconds;
      shortest = std::min(shortest, seconds);
    }
    least = std::min(least, std::max(phases, compute_seconds + shortest));
  }
  return (least + commit_seconds_) * (1 - 1e-9);
}

}  // namespace scheduler
}  // namespace muonps
