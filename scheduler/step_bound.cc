#include "scheduler/step_bound.h"

#include <algorithm>
#include <limits>
#include <vector>

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
  // The agreement before every transfer, and the commit as ClockStep adds
  // it: the vote, and every trainer applies every matrix there or, with
  // the applies before the votes, after its worker's own stacks, each
  // parameter copied aside first.
  agreement_seconds_ = settings.agreement_ms * 1e-3;
  vote_seconds_ = (settings.control_rounds_ms - settings.agreement_ms) * 1e-3;
  apply_at_commit_seconds_ = ApplySeconds(matrices, /*workers=*/1, settings);
  if (settings.apply_early) {
    double elements = 0;
    for (const MatrixSpec& m : matrices) {
      elements += static_cast<double>(m.rows * m.cols * m.experts);
    }
    apply_before_votes_seconds_ = ApplyBeforeVotesSeconds(elements, settings);
  }
  const std::vector<int64_t> bounds =
      options.bucket_bytes > 0 ? std::vector<int64_t>{options.bucket_bytes}
                               : BucketBoundsTried(matrices);
  const std::vector<int32_t> arrival = ArrivalOrder(matrices);
  // Cut as the schedule cuts them (BucketEnds).
  for (const int64_t bound : bounds) {
    std::vector<BucketSum>& cut = cuts_.emplace_back();
    size_t begin = 0;
    for (const size_t end : BucketEnds(matrices, arrival, bound)) {
      BucketSum& sum = cut.emplace_back();
      for (size_t i = begin; i < end; ++i) {
        const MatrixSpec& m = matrices[arrival[i]];
        sum.messages += m.experts;
        sum.bytes += static_cast<double>(m.rows * m.cols *
                                         settings.update_bytes_per_element) *
                     static_cast<double>(m.experts);
      }
      begin = end;
    }
  }
}

double StepBound::Seconds(const std::vector<int32_t>& ranks,
                          double compute_seconds) const {
  std::vector<double> cuts = CutSeconds(ranks, compute_seconds);
  return cuts.empty() ? 0 : *std::min_element(cuts.begin(), cuts.end());
}

std::vector<double> StepBound::CutSeconds(const std::vector<int32_t>& ranks,
                                          double compute_seconds) const {
  const std::vector<int32_t>& node = settings_.topology.node;
  if (!holds_ || ranks.size() < 2 || node.empty()) return {};
  absl::flat_hash_map<int32_t, int> on_node;
  int g = 1;
  for (const int32_t r : ranks) g = std::max(g, ++on_node[node[r]]);
  if (on_node.size() < 2) return {};  // one node: peer writes, not rings
  const LinkFigures& l = settings_.topology.links;
  const double n = static_cast<double>(ranks.size());
  std::vector<double> out;
  out.reserve(cuts_.size());
  for (const std::vector<BucketSum>& cut : cuts_) {
    double phases = 0;
    double shortest = std::numeric_limits<double>::infinity();
    double least_bytes = std::numeric_limits<double>::infinity();
    for (const BucketSum& b : cut) {
      least_bytes = std::min(least_bytes, b.bytes);
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
    // At the commit: the stage (its phases after the agreement; the
    // busiest worker's stacks, which may begin before it, then the
    // shortest phase), then every apply. Before the votes: the stage and
    // the applies of the bucket that lands last (at least the smallest's),
    // or the busiest worker's stacks and then every apply.
    const double transfers = agreement_seconds_ + phases;
    double least = std::max(transfers, compute_seconds + shortest) +
                   apply_at_commit_seconds_;
    if (apply_before_votes_seconds_ >= 0) {
      const double last_apply = ApplyBeforeVotesSeconds(
          least_bytes / settings_.update_bytes_per_element, settings_);
      least = std::min(least,
                       std::max(transfers + last_apply,
                                compute_seconds + apply_before_votes_seconds_));
    }
    out.push_back((least + vote_seconds_) * (1 - 1e-9));
  }
  return out;
}

std::vector<ExchangeStep> ExchangeStepsOf(int nodes, int per_node,
                                          double elements, double packed,
                                          bool update,
                                          const ClockSettings& settings) {
  const double e = update ? settings.update_bytes_per_element
                          : settings.wire_bytes_per_element;
  const double hbm = settings.hbm_bytes_per_second;
  const int g = per_node;
  // Elements of a block; each gradient element added in HBM is two fp32
  // reads and a write.
  const double block = packed / g;
  std::vector<ExchangeStep> out;
  // Within each node every member sends its G - 1 other blocks and
  // receives G - 1 of its own, and adds them.
  if (g > 1) {
    out.push_back({.bytes = block * e * (g - 1),
                   .hbm_after_seconds = 12.0 * block * (g - 1) / hbm});
  }
  // Along each rail a ring over the M nodes: its block through every
  // member's NIC, the reduce adding as it moves.
  if (nodes > 1) {
    out.push_back({.across = true,
                   .reduce = !update,
                   .hops = nodes - 1,
                   .bytes = block * e});
  }
  if (g > 1) out.push_back({.parts = true});
  // The items copied into the pack (gradients) or out of it (updates),
  // read and written.
  const double copies = 2.0 * elements * e / hbm;
  if (update) {
    std::reverse(out.begin(), out.end());
    for (ExchangeStep& step : out) step.hbm_after_seconds = 0;
    out.back().hbm_after_seconds = copies;
  } else {
    out.front().hbm_before_seconds = copies;
  }
  return out;
}

double ExchangeStepBound(const std::vector<MatrixSpec>& matrices, int workers,
                         int nodes, int per_node,
                         const ClockSettings& settings) {
  double elements = 0;
  for (const MatrixSpec& m : matrices) {
    if (m.layout != Layout::kUnreduced) continue;
    elements += static_cast<double>(m.rows * m.cols * m.experts);
  }
  if (elements == 0) return 0;
  const LinkFigures& l = settings.topology.links;
  double least = 0;
  for (const bool update : {false, true}) {
    const std::vector<ExchangeStep> steps =
        ExchangeStepsOf(nodes, per_node, elements, elements, update, settings);
    double latency = 0, within = 0, across = 0, hbm = 0;
    for (const ExchangeStep& step : steps) {
      latency += (l.latency_us + step.hops * l.hop_latency_us) * 1e-6;
      (step.across ? across : within) += step.bytes;
      hbm += step.hbm_before_seconds + step.hbm_after_seconds;
    }
    least += latency +
             std::max(within / (l.nvlink_gbs * 1e9),
                      across / (l.inter_node_gbs * 1e9)) +
             hbm;
  }
  least += ControlSeconds(workers, settings);
  if (!settings.apply_early || workers < 2) {
    least += ApplySeconds(matrices, workers, settings);
  }
  return least * (1 - 1e-9);
}

}  // namespace scheduler
}  // namespace muonps
