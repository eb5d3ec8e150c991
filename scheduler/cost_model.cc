#include "scheduler/cost_model.h"

#include <algorithm>

#include "kernels/ns_flops.h"

namespace muonps {
namespace scheduler {
namespace {

// Tables are measured with torch.optim.Muon's 5 steps.
constexpr int kTableSteps = 5;

double Interpolate(const CostTable::Curve& curve, int64_t batch) {
  const auto& first = curve.front();
  if (batch <= first.first) {
    return first.second * static_cast<double>(batch) / first.first;
  }
  for (size_t i = 1; i < curve.size(); ++i) {
    if (batch <= curve[i].first || i + 1 == curve.size()) {
      const auto& lo = curve[i - 1];
      const auto& hi = curve[i];
      const double slope = (hi.second - lo.second) / (hi.first - lo.first);
      // Past the last point a falling segment (timing noise) would
      // extrapolate to negative times: more matrices never take less.
      if (batch > hi.first) {
        return hi.second +
               std::max(slope, 0.0) * static_cast<double>(batch - hi.first);
      }
      return lo.second + slope * static_cast<double>(batch - lo.first);
    }
  }
  // A single point: proportional past it too.
  return first.second * static_cast<double>(batch) / first.first;
}

}  // namespace

CostModel::CostModel(std::shared_ptr<const CostTable> table,
                     const DeviceRates& rates, double speed, int ns_steps)
    : table_(std::move(table)),
      rates_(rates),
      speed_(speed),
      ns_steps_(ns_steps) {
  ns5_options_.steps = ns_steps;
  gram_options_.steps = ns_steps;
  gram_options_.algorithm = kernels::NsAlgorithm::kGram;
}

double CostModel::FallbackSeconds(int64_t rows, int64_t cols, int64_t batch,
                                  kernels::NsAlgorithm algorithm) const {
  const double flops = kernels::NsExecutedFlops(
      rows, cols,
      algorithm == kernels::NsAlgorithm::kGram ? gram_options_ : ns5_options_);
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  // bf16 traffic per step: read X twice, write it once, and the m x m
  // products (Gram NS touches the long side only at its ends).
  const double per_step = algorithm == kernels::NsAlgorithm::kNs5
                              ? 2.0 * (3 * m * n + 4 * m * m)
                              : 2.0 * (6 * m * m);
  const double bytes =
      ns_steps_ * per_step +
      (algorithm == kernels::NsAlgorithm::kGram ? 2.0 * 4 * m * n : 0.0);
  const double each = std::max(flops / rates_.flops_per_second,
                               bytes / rates_.memory_bytes_per_second);
  return rates_.call_overhead_seconds + static_cast<double>(batch) * each;
}

double CostModel::NsSeconds(int64_t rows, int64_t cols, int64_t batch,
                            kernels::NsAlgorithm algorithm) const {
  if (batch <= 0) return 0;
  double seconds;
  const CostTable::Curve* curve =
      table_ == nullptr ? nullptr : table_->Find(rows, cols, algorithm);
  if (curve != nullptr && !curve->empty()) {
    seconds = Interpolate(*curve, batch) * ns_steps_ / kTableSteps;
  } else {
    seconds = FallbackSeconds(rows, cols, batch, algorithm);
  }
  return seconds / speed_;
}

CostModel::Choice CostModel::Best(int64_t rows, int64_t cols, int64_t batch,
                                  AlgorithmPolicy policy) const {
  if (policy == AlgorithmPolicy::kNs5) {
    return {kernels::NsAlgorithm::kNs5,
            NsSeconds(rows, cols, batch, kernels::NsAlgorithm::kNs5)};
  }
  const double gram = NsSeconds(rows, cols, batch, kernels::NsAlgorithm::kGram);
  if (policy == AlgorithmPolicy::kGram) {
    return {kernels::NsAlgorithm::kGram, gram};
  }
  const double ns5 = NsSeconds(rows, cols, batch, kernels::NsAlgorithm::kNs5);
  if (gram < ns5) return {kernels::NsAlgorithm::kGram, gram};
  return {kernels::NsAlgorithm::kNs5, ns5};
}

}  // namespace scheduler
}  // namespace muonps
