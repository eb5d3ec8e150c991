#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

// Calls whose label values do not match the family's label names in number
// (Increment, Set, Add, Remove, Observe) are ignored: nothing is recorded,
// nothing is counted anywhere, and nothing crashes. A metric must never take
// down the trainer it observes; tests that read the rendered text catch the
// mistake instead. Value() and Count() answer 0 for such label sets.
//
// Families without labels start with one zero-valued series, as the Go
// client does, so a counter that never fired still shows up as 0.

namespace muonps {
namespace {

bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(absl::string_view name) {
  if (name.empty() || !(IsNameStart(name[0]) || name[0] == ':')) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return IsNameChar(c) || c == ':'; });
}

// [a-zA-Z_][a-zA-Z0-9_]*, and names starting with "__" are reserved for
// Prometheus itself.
bool IsValidLabelName(absl::string_view name) {
  if (name.empty() || !IsNameStart(name[0])) return false;
  if (name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;
  return std::all_of(name.begin(), name.end(), IsNameChar);
}

// A family is well formed when its name and label names are valid and its
// label names are distinct; histograms may not use "le", which their bucket
// lines add.
bool IsValidFamily(absl::string_view name,
                   const std::vector<std::string>& label_names,
                   bool is_histogram) {
  if (!IsValidMetricName(name)) return false;
  std::set<std::string> seen;
  for (const std::string& label : label_names) {
    if (!IsValidLabelName(label) || !seen.insert(label).second) return false;
    if (is_histogram && label == "le") return false;
  }
  return true;
}

// Integers print in full ("1000000", not "1e+06") while they fit int64;
// other values print in the shortest form that parses back to the same
// double. std::to_chars ignores the locale, unlike printf.
std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::trunc(value) && std::fabs(value) < 9.2e18) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buffer[64];
  const std::to_chars_result result = std::to_chars(
      buffer, buffer + sizeof(buffer), value, std::chars_format::general);
  return std::string(buffer, result.ptr);
}

// Label values escape backslash, double quote and newline.
std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Help text escapes backslash and newline only.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void AppendHeader(std::string* out, absl::string_view name,
                  absl::string_view help, absl::string_view type) {
  absl::StrAppend(out, "# HELP ", name, " ", EscapeHelp(help), "\n");
  absl::StrAppend(out, "# TYPE ", name, " ", type, "\n");
}

// `{a="1",b="2"}` for the family's labels plus an optional `le`; nothing at
// all when there are no labels.
std::string LabelBlock(const std::vector<std::string>& names,
                       const LabelValues& values, absl::string_view le = {}) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StrAppend(&out, out.empty() ? "{" : ",", names[i], "=\"",
                    EscapeLabelValue(values[i]), "\"");
  }
  if (!le.empty())
    absl::StrAppend(&out, out.empty() ? "{" : ",", "le=\"", le, "\"");
  if (!out.empty()) out += "}";
  return out;
}

}  // namespace

std::vector<double> LatencyBounds() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
}

Counter::Counter(std::string name, std::string help,
                 std::vector<std::string> labels)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(labels)) {
  if (label_names_.empty()) values_[{}] = 0;
}

void Counter::Increment(const LabelValues& labels, double by) {
  // Counters only go up; `!(by >= 0)` also drops NaN.
  if (labels.size() != label_names_.size() || !(by >= 0)) return;
  absl::MutexLock lock(&mu_);
  values_[labels] += by;
}

double Counter::Value(const LabelValues& labels) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(labels);
  return it == values_.end() ? 0 : it->second;
}

Gauge::Gauge(std::string name, std::string help,
             std::vector<std::string> labels)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(labels)) {
  if (label_names_.empty()) values_[{}] = 0;
}

void Gauge::Set(double value, const LabelValues& labels) {
  if (labels.size() != label_names_.size()) return;
  absl::MutexLock lock(&mu_);
  values_[labels] = value;
}

void Gauge::Add(double delta, const LabelValues& labels) {
  if (labels.size() != label_names_.size()) return;
  absl::MutexLock lock(&mu_);
  values_[labels] += delta;
}

void Gauge::Remove(const LabelValues& labels) {
  if (labels.size() != label_names_.size()) return;
  absl::MutexLock lock(&mu_);
  values_.erase(labels);
}

double Gauge::Value(const LabelValues& labels) const {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(labels);
  return it == values_.end() ? 0 : it->second;
}

// Bounds are normalised rather than rejected: sorted, duplicates and NaN
// dropped, and +Inf dropped because the +Inf bucket is always present.
Histogram::Histogram(std::string name, std::string help,
                     std::vector<std::string> labels,
                     std::vector<double> bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      label_names_(std::move(labels)),
      bounds_(std::move(bounds)) {
  bounds_.erase(
      std::remove_if(bounds_.begin(), bounds_.end(),
                     [](double b) {
                       return std::isnan(b) ||
                              b == std::numeric_limits<double>::infinity();
                     }),
      bounds_.end());
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  if (label_names_.empty()) series_[{}].buckets.assign(bounds_.size(), 0);
}

void Histogram::Observe(double value, const LabelValues& labels) {
  if (labels.size() != label_names_.size()) return;
  // The first bound >= value: an observation equal to a bound counts in that
  // bucket (le means "less than or equal"). NaN lands past every bound, in
  // +Inf only, as in the Go client.
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  Series& series = series_[labels];
  if (series.buckets.empty()) series.buckets.assign(bounds_.size(), 0);
  if (bucket < bounds_.size()) ++series.buckets[bucket];
  ++series.count;
  series.sum += value;
}

uint64_t Histogram::Count(const LabelValues& labels) const {
  absl::MutexLock lock(&mu_);
  auto it = series_.find(labels);
  return it == series_.end() ? 0 : it->second.count;
}

Counter* MetricsRegistry::AddCounter(absl::string_view name,
                                     absl::string_view help,
                                     std::vector<std::string> label_names) {
  const std::string key(name);
  absl::MutexLock lock(&mu_);
  if (auto it = counters_.find(key); it != counters_.end()) {
    return it->second->label_names_ == label_names ? it->second.get() : nullptr;
  }
  if (gauges_.count(key) > 0 || histograms_.count(key) > 0 ||
      !IsValidFamily(key, label_names, /*is_histogram=*/false)) {
    return nullptr;
  }
  Counter* counter =
      new Counter(key, std::string(help), std::move(label_names));
  counters_.emplace(key, absl::WrapUnique(counter));
  return counter;
}

Gauge* MetricsRegistry::AddGauge(absl::string_view name, absl::string_view help,
                                 std::vector<std::string> label_names) {
  const std::string key(name);
  absl::MutexLock lock(&mu_);
  if (auto it = gauges_.find(key); it != gauges_.end()) {
    return it->second->label_names_ == label_names ? it->second.get() : nullptr;
  }
  if (counters_.count(key) > 0 || histograms_.count(key) > 0 ||
      !IsValidFamily(key, label_names, /*is_histogram=*/false)) {
    return nullptr;
  }
  Gauge* gauge = new Gauge(key, std::string(help), std::move(label_names));
  gauges_.emplace(key, absl::WrapUnique(gauge));
  return gauge;
}

Histogram* MetricsRegistry::AddHistogram(absl::string_view name,
                                         absl::string_view help,
                                         std::vector<std::string> label_names,
                                         std::vector<double> bounds) {
  const std::string key(name);
  absl::MutexLock lock(&mu_);
  // As documented, only kind and labels decide a match; the first family's
  // bounds stay in force.
  if (auto it = histograms_.find(key); it != histograms_.end()) {
    return it->second->label_names_ == label_names ? it->second.get() : nullptr;
  }
  if (counters_.count(key) > 0 || gauges_.count(key) > 0 ||
      !IsValidFamily(key, label_names, /*is_histogram=*/true)) {
    return nullptr;
  }
  Histogram* histogram = new Histogram(
      key, std::string(help), std::move(label_names), std::move(bounds));
  histograms_.emplace(key, absl::WrapUnique(histogram));
  return histogram;
}

std::string MetricsRegistry::RenderText() const {
  // Family names are unique across the three maps, so merging the three
  // sorted renderings by name gives one sorted text.
  std::map<std::string, std::string> families;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, counter] : counters_) {
    std::string& out = families[name];
    AppendHeader(&out, name, counter->help_, "counter");
    absl::MutexLock family_lock(&counter->mu_);
    for (const auto& [labels, value] : counter->values_) {
      absl::StrAppend(&out, name, LabelBlock(counter->label_names_, labels),
                      " ", FormatValue(value), "\n");
    }
  }
  for (const auto& [name, gauge] : gauges_) {
    std::string& out = families[name];
    AppendHeader(&out, name, gauge->help_, "gauge");
    absl::MutexLock family_lock(&gauge->mu_);
    for (const auto& [labels, value] : gauge->values_) {
      absl::StrAppend(&out, name, LabelBlock(gauge->label_names_, labels), " ",
                      FormatValue(value), "\n");
    }
  }
  for (const auto& [name, histogram] : histograms_) {
    std::string& out = families[name];
    AppendHeader(&out, name, histogram->help_, "histogram");
    const std::vector<std::string>& label_names = histogram->label_names_;
    absl::MutexLock family_lock(&histogram->mu_);
    for (const auto& [labels, series] : histogram->series_) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i < histogram->bounds_.size(); ++i) {
        cumulative += series.buckets[i];
        absl::StrAppend(
            &out, name, "_bucket",
            LabelBlock(label_names, labels, FormatValue(histogram->bounds_[i])),
            " ", cumulative, "\n");
      }
      absl::StrAppend(&out, name, "_bucket",
                      LabelBlock(label_names, labels, "+Inf"), " ",
                      series.count, "\n");
      absl::StrAppend(&out, name, "_sum", LabelBlock(label_names, labels), " ",
                      FormatValue(series.sum), "\n");
      absl::StrAppend(&out, name, "_count", LabelBlock(label_names, labels),
                      " ", series.count, "\n");
    }
  }
  std::string text;
  for (const auto& [name, block] : families) text += block;
  return text;
}

}  // namespace muonps
