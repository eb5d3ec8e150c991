// Prometheus metrics: a registry of counters, gauges and histograms with
// labels, rendered in the Prometheus text exposition format (version
// 0.0.4). The servers' HTTP(S) endpoint serving it on /metrics is
// server/metrics_server/metrics_server.h.
//
// Names follow the house rules: "muonps_" prefix, base units in the name
// ("_seconds", "_bytes"), counters end in "_total", labels take bounded
// values. A MetricsRegistry and its metrics are safe for concurrent use;
// metric objects live as long as the registry that made them.
#ifndef MUONPS_COMMON_METRICS_H_
#define MUONPS_COMMON_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace muonps {

// Label values in the order of the family's label names.
using LabelValues = std::vector<std::string>;

// A monotonically increasing value per label set.
class Counter {
 public:
  void Increment(const LabelValues& labels = {}, double by = 1.0);
  double Value(const LabelValues& labels = {}) const;

 private:
  friend class MetricsRegistry;
  Counter(std::string name, std::string help, std::vector<std::string> labels);
  std::string name_, help_;
  std::vector<std::string> label_names_;
  mutable absl::Mutex mu_;
  std::map<LabelValues, double> values_ ABSL_GUARDED_BY(mu_);
};

// A value that goes up and down per label set.
class Gauge {
 public:
  void Set(double value, const LabelValues& labels = {});
  void Add(double delta, const LabelValues& labels = {});
  // Drops a label set (e.g. a deleted job) from the output.
  void Remove(const LabelValues& labels);
  double Value(const LabelValues& labels = {}) const;

 private:
  friend class MetricsRegistry;
  Gauge(std::string name, std::string help, std::vector<std::string> labels);
  std::string name_, help_;
  std::vector<std::string> label_names_;
  mutable absl::Mutex mu_;
  std::map<LabelValues, double> values_ ABSL_GUARDED_BY(mu_);
};

// Observations counted into cumulative buckets, with their sum and count.
class Histogram {
 public:
  void Observe(double value, const LabelValues& labels = {});
  // Observations so far for a label set.
  uint64_t Count(const LabelValues& labels = {}) const;

 private:
  friend class MetricsRegistry;
  Histogram(std::string name, std::string help, std::vector<std::string> labels,
            std::vector<double> bounds);
  struct Series {
    std::vector<uint64_t> buckets;  // per bound, non-cumulative
    uint64_t count = 0;
    double sum = 0;
  };
  std::string name_, help_;
  std::vector<std::string> label_names_;
  std::vector<double> bounds_;  // ascending upper bounds; +Inf implied
  mutable absl::Mutex mu_;
  std::map<LabelValues, Series> series_ ABSL_GUARDED_BY(mu_);
};

// Default histogram bounds for latencies: 100 us to 10 s.
std::vector<double> LatencyBounds();

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Each creates and registers a metric family; the registry owns it. A
  // name registered twice returns the first family if the kind and labels
  // match, else nullptr (a programming error caught by tests).
  Counter* AddCounter(absl::string_view name, absl::string_view help,
                      std::vector<std::string> label_names = {});
  Gauge* AddGauge(absl::string_view name, absl::string_view help,
                  std::vector<std::string> label_names = {});
  Histogram* AddHistogram(absl::string_view name, absl::string_view help,
                          std::vector<std::string> label_names = {},
                          std::vector<double> bounds = LatencyBounds());

  // Every family in the text exposition format, sorted by name.
  std::string RenderText() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Counter>> counters_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Gauge>> gauges_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Histogram>> histograms_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace muonps

#endif  // MUONPS_COMMON_METRICS_H_
