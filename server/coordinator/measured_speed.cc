#include "server/coordinator/measured_speed.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/statistics.h"

namespace muonps {
namespace coordinator {
namespace {

// Whether every rank that owns matrices is a GPU with a full window.
bool AllMeasured(const std::vector<RankSpeed>& ranks) {
  for (const RankSpeed& r : ranks) {
    if (r.owns && (!r.gpu || r.speed == nullptr || !r.speed->measured())) {
      return false;
    }
  }
  return true;
}

}  // namespace

void MeasuredSpeed::Add(const StepStats& stats) {
  if (stats.plan_version < since_version_ || !(stats.ns_seconds > 0) ||
      !(stats.predicted_ns_seconds > 0)) {
    return;
  }
  samples_.push_back(
      {stats.ns_seconds, stats.predicted_ns_seconds, stats.step_seconds});
  if (static_cast<int>(samples_.size()) > kWindow) {
    samples_.erase(samples_.begin());
  }
}

double MeasuredSpeed::MedianSeconds() const {
  std::vector<double> seconds;
  for (const Sample& s : samples_) seconds.push_back(s.measured);
  return seconds.empty() ? 0 : Median(std::move(seconds));
}

std::vector<double> MeasuredSpeed::StepSeconds() const {
  std::vector<double> out;
  for (const Sample& s : samples_) out.push_back(s.step);
  return out;
}

double MeasuredSpeed::Estimate() const {
  std::vector<double> ratios;
  for (const Sample& s : samples_) ratios.push_back(s.predicted / s.measured);
  return ratios.empty() ? factor_ : factor_ * Median(std::move(ratios));
}

void MeasuredSpeed::Set(double factor, int64_t version) {
  factor_ = factor;
  since_version_ = version;
  samples_.clear();
}

std::optional<Rebalance> RebalanceByMeasurement(
    const std::vector<RankSpeed>& ranks, double tolerance) {
  if (!(tolerance > 0)) return std::nullopt;
  double sum = 0, busiest = 0;
  int counted = 0;
  bool moved = false;
  if (!AllMeasured(ranks)) return std::nullopt;
  for (const RankSpeed& r : ranks) {
    if (!r.owns) continue;
    const double seconds = r.speed->MedianSeconds();
    sum += seconds;
    busiest = std::max(busiest, seconds);
    ++counted;
    moved |= std::abs(r.speed->Estimate() / r.speed->factor() - 1) > tolerance;
  }
  if (counted < 2 || !(sum > 0)) return std::nullopt;
  const double mean = sum / counted;
  const double imbalance = busiest / mean - 1;
  if (imbalance <= tolerance || busiest - mean <= kMinGainSeconds || !moved) {
    return std::nullopt;
  }
  Rebalance out;
  out.imbalance = imbalance;
  std::string speeds;
  for (const RankSpeed& r : ranks) {
    const bool measured = r.owns && r.speed != nullptr;
    const double factor =
        measured ? r.speed->Estimate() : (r.speed ? r.speed->factor() : 1.0);
    out.factors.push_back(factor);
    if (measured) {
      absl::StrAppend(&speeds, speeds.empty() ? "" : ", ", r.worker_id, " ",
                      absl::StrFormat("%.3f", factor));
    }
  }
  out.reason = absl::StrFormat(
      "measured speeds against the cost tables: %s (the busiest rank's "
      "Newton-Schulz %.1f%% above the mean)",
      speeds, 100 * imbalance);
  return out;
}

namespace {

// The median step time of the owners' windows, pooled.
double MedianStepSeconds(const std::vector<RankSpeed>& ranks) {
  std::vector<double> all;
  for (const RankSpeed& r : ranks) {
    if (!r.owns || r.speed == nullptr) continue;
    const std::vector<double> mine = r.speed->StepSeconds();
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all.empty() ? 0 : Median(std::move(all));
}

std::vector<std::string> Ids(const std::vector<RankSpeed>& ranks) {
  std::vector<std::string> out;
  for (const RankSpeed& r : ranks) out.push_back(r.worker_id);
  return out;
}

}  // namespace

std::optional<Rebalance> SpeedBalance::Consider(
    const std::vector<RankSpeed>& ranks, double tolerance) {
  constexpr double kStepMargin = 0.01;
  if (state_ != State::kOpen && Ids(ranks) != ids_) state_ = State::kOpen;
  if (!(tolerance > 0) || state_ == State::kSettled || !AllMeasured(ranks)) {
    return std::nullopt;
  }
  const double step = MedianStepSeconds(ranks);
  if (state_ == State::kTrial) {
    if (step > before_step_seconds_ * (1 + kStepMargin)) {
      state_ = State::kSettled;
      Rebalance undo;
      undo.factors = before_factors_;
      undo.reason = absl::StrFormat(
          "measured speeds lengthened the step (%.1f ms against %.1f ms "
          "before): the speeds before",
          step * 1e3, before_step_seconds_ * 1e3);
      return undo;
    }
    if (!(step < before_step_seconds_ * (1 - kStepMargin))) {
      state_ = State::kSettled;
      return std::nullopt;
    }
    state_ = State::kOpen;
  }
  std::optional<Rebalance> out = RebalanceByMeasurement(ranks, tolerance);
  if (!out.has_value()) return std::nullopt;
  state_ = State::kTrial;
  ids_ = Ids(ranks);
  before_factors_.clear();
  for (const RankSpeed& r : ranks) {
    before_factors_.push_back(r.speed != nullptr ? r.speed->factor() : 1.0);
  }
  before_step_seconds_ = step;
  absl::StrAppend(&out->reason,
                  absl::StrFormat("; step %.1f ms before", step * 1e3));
  return out;
}

}  // namespace coordinator
}  // namespace muonps
