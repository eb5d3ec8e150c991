// MetricsServer: the /metrics HTTP(S) endpoint of muonps-coordinator and
// muonps-worker, serving a MetricsRegistry (common/metrics.h) with the
// address, bearer-token and TLS rules of the house. Only the server
// binaries listen for metrics, so this lives in server/, not common/.
// Thread rule: a MetricsServer is created, used and destroyed from one
// thread; the registry it serves may change concurrently.
#ifndef MUONPS_SERVER_METRICS_SERVER_METRICS_SERVER_H_
#define MUONPS_SERVER_METRICS_SERVER_METRICS_SERVER_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace muonps {

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

#endif  // MUONPS_SERVER_METRICS_SERVER_METRICS_SERVER_H_
