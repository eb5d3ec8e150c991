#include "scheduler/cost_model.h"

#include <algorithm>
#include <utility>

#include "newton_schulz/flops.h"

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
  gram_options_.algorithm = NsAlgorithm::kGram;
}

double CostModel::FallbackSeconds(int64_t rows, int64_t cols, int64_t batch,
                                  NsAlgorithm algorithm) const {
  const double flops = NsExecutedFlops(
      rows, cols,
      algorithm == NsAlgorithm::kGram ? gram_options_ : ns5_options_);
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  // bf16 traffic per step: read X twice, write it once, and the m x m
  // products (Gram NS touches the long side only at its ends).
  const double per_step = algorithm == NsAlgorithm::kNs5
                              ? 2.0 * (3 * m * n + 4 * m * m)
                              : 2.0 * (6 * m * m);
  const double bytes =
      ns_steps_ * per_step +
      (algorithm == NsAlgorithm::kGram ? 2.0 * 4 * m * n : 0.0);
  const double each = std::max(flops / rates_.flops_per_second,
                               bytes / rates_.memory_bytes_per_second);
  return rates_.call_overhead_seconds + static_cast<double>(batch) * each;
}

const CostTable::Curve* CostModel::Measured(int64_t rows, int64_t cols,
                                            NsAlgorithm algorithm) const {
  const CostTable::Curve* curve =
      table_ == nullptr ? nullptr : table_->Find(rows, cols, algorithm);
  return curve == nullptr || curve->empty() ? nullptr : curve;
}

double CostModel::NsSeconds(int64_t rows, int64_t cols, int64_t batch,
                            NsAlgorithm algorithm) const {
  if (batch <= 0) return 0;
  double seconds;
  const CostTable::Curve* curve = Measured(rows, cols, algorithm);
  if (curve != nullptr) {
    seconds = Interpolate(*curve, batch) * ns_steps_ / kTableSteps;
  } else {
    seconds = FallbackSeconds(rows, cols, batch, algorithm);
  }
  return seconds / speed_;
}

CostModel::Choice CostModel::Best(int64_t rows, int64_t cols, int64_t batch,
                                  AlgorithmPolicy policy) const {
  if (policy == AlgorithmPolicy::kNs5) {
    return {NsAlgorithm::kNs5, NsSeconds(rows, cols, batch, NsAlgorithm::kNs5)};
  }
  const double gram = NsSeconds(rows, cols, batch, NsAlgorithm::kGram);
  if (policy == AlgorithmPolicy::kGram) {
    return {NsAlgorithm::kGram, gram};
  }
  const double ns5 = NsSeconds(rows, cols, batch, NsAlgorithm::kNs5);
  if (gram < ns5) return {NsAlgorithm::kGram, gram};
  return {NsAlgorithm::kNs5, ns5};
}

BatchSplitter::BatchSplitter(const CostModel& model, int64_t rows, int64_t cols,
                             AlgorithmPolicy policy)
    : model_(&model), rows_(rows), cols_(cols), policy_(policy) {}

const BatchSplitter::Entry& BatchSplitter::At(int64_t n) {
  if (static_cast<int64_t>(memo_.size()) > n) return memo_[n];
  // The curves a split may draw its part sizes from: only measured ones
  // (none: the roofline, which never gains from a split).
  const CostTable::Curve* curves[2] = {nullptr, nullptr};
  if (policy_ != AlgorithmPolicy::kGram) {
    curves[0] = model_->Measured(rows_, cols_, NsAlgorithm::kNs5);
  }
  if (policy_ != AlgorithmPolicy::kNs5) {
    curves[1] = model_->Measured(rows_, cols_, NsAlgorithm::kGram);
  }
  const bool measured = curves[0] != nullptr || curves[1] != nullptr;
  if (memo_.empty()) memo_.push_back({BatchPart{}, 0.0, 0});
  for (int64_t k = static_cast<int64_t>(memo_.size()); k <= n; ++k) {
    const CostModel::Choice choice = model_->Best(rows_, cols_, k, policy_);
    Entry entry{{k, choice.algorithm, choice.seconds}, choice.seconds, 0};
    // First part a (1 or a measured size < k), then the best of the rest.
    auto consider = [&](int64_t a) {
      const double t = memo_[a].whole.seconds + memo_[k - a].optimum;
      if (t < entry.optimum) {
        entry.optimum = t;
        entry.first = a;
      }
    };
    if (measured && k > 1) {
      consider(1);
      for (const CostTable::Curve* curve : curves) {
        if (curve == nullptr) continue;
        for (const auto& [a, seconds] : *curve) {
          if (a >= k) break;
          if (a > 1) consider(a);
        }
      }
    }
    memo_.push_back(entry);
  }
  return memo_[n];
}

double BatchSplitter::Seconds(int64_t n) {
  if (n <= 0) return 0;
  const Entry& entry = At(n);
  return Splits(entry) ? entry.optimum : entry.whole.seconds;
}

BatchParts BatchSplitter::Parts(int64_t n) {
  if (n <= 0) return {};
  At(n);
  if (!Splits(memo_[n])) return {memo_[n].whole};
  BatchParts parts;
  // The optimum's chain: its first part, then the rest's optimum.
  int64_t k = n;
  for (; memo_[k].first > 0; k -= memo_[k].first) {
    parts.push_back(memo_[memo_[k].first].whole);
  }
  parts.push_back(memo_[k].whole);
  std::stable_sort(
      parts.begin(), parts.end(), [](const BatchPart& x, const BatchPart& y) {
        return std::make_pair(-x.count, static_cast<int>(x.algorithm)) <
               std::make_pair(-y.count, static_cast<int>(y.algorithm));
      });
  return parts;
}

}  // namespace scheduler
}  // namespace muonps
