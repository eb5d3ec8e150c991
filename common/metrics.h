// Prometheus metrics: a registry of counters, gauges and histograms with
// labels, rendered in the Prometheus text exposition format (version
// 0.0.4), and an HTTP endpoint serving it on /metrics.
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
#include <optional>
#include <string>
#include <thread>
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

// Where and how MetricsServer serves. Filled from the binaries' flags by
// MetricsServerOptionsFromFlags.
struct MetricsServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: a free one
  // When not empty, every request must carry "Authorization: Bearer
  // <token>" (compared in constant time); others get 401. Required when
  // `host` is not a loopback address.
  std::string bearer_token;
  // PEM files; both set: HTTPS instead of HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;
};

// The flags --metrics_address HOST:PORT, --metrics_port (-1: disabled, in
// which case the result is nullopt; > 0: replaces the address's port),
// --metrics_token_file (else $MUONPS_METRICS_TOKEN_FILE) and
// --metrics_tls_cert/--metrics_tls_key, checked. INVALID_ARGUMENT naming
// the flag for a malformed address, a port out of [0, 65535], only one of
// cert and key, or a non-loopback address without a token file;
// FAILED_PRECONDITION naming the token file when it cannot be read or is
// empty. The token is read here and never logged.
absl::StatusOr<std::optional<MetricsServerOptions>>
MetricsServerOptionsFromFlags(const std::string& address, int port,
                              const std::string& token_file,
                              const std::string& tls_cert_file,
                              const std::string& tls_key_file);

// Serves GET /metrics (the registry's text, Content-Type
// "text/plain; version=0.0.4") and GET /healthz ("ok") in a background
// thread until destroyed. Thread-safe: the registry may change while it
// serves; the server itself is used from one thread.
class MetricsServer {
 public:
  // Starts serving as `options` say. INVALID_ARGUMENT for a port out of
  // [0, 65535] or a non-loopback host without a bearer token;
  // FAILED_PRECONDITION naming the files when the TLS certificate or key
  // cannot be loaded; UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsRegistry* registry, const MetricsServerOptions& options);
  // Plain HTTP on host:port, no token (loopback hosts only).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const MetricsRegistry* registry, const std::string& host, int port);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  // "http://HOST:PORT/metrics" or "https://...".
  const std::string& url() const { return url_; }

 private:
  MetricsServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::string url_;
};

}  // namespace muonps

#endif  // MUONPS_COMMON_METRICS_H_
