#include "server/metrics_flags/metrics_flags.h"

#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, metrics_address, "127.0.0.1:0",
          "Prometheus /metrics HTTP address, HOST:PORT (port 0 picks a free "
          "one). Off loopback it needs --metrics_token_file.");
ABSL_FLAG(int, metrics_port, 0,
          "-1 disables /metrics; a port > 0 replaces --metrics_address's.");
ABSL_FLAG(std::string, metrics_token_file, "",
          "File holding the bearer token every /metrics request must carry "
          "(default: $MUONPS_METRICS_TOKEN_FILE); required off loopback.");
ABSL_FLAG(std::string, metrics_tls_cert, "",
          "PEM certificate: serve /metrics over HTTPS (with "
          "--metrics_tls_key).");
ABSL_FLAG(std::string, metrics_tls_key, "", "PEM key of --metrics_tls_cert.");

namespace muonps {
namespace server {

namespace {

absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
    MetricsRegistry* registry) {
  MUONPS_ASSIGN_OR_RETURN(
      const std::optional<MetricsServerOptions> options,
      MetricsServerOptionsFromFlags(absl::GetFlag(FLAGS_metrics_address),
                                    absl::GetFlag(FLAGS_metrics_port),
                                    absl::GetFlag(FLAGS_metrics_token_file),
                                    absl::GetFlag(FLAGS_metrics_tls_cert),
                                    absl::GetFlag(FLAGS_metrics_tls_key)));
  if (!options.has_value()) return nullptr;
  return MetricsServer::Start(registry, *options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerFromFlags(
    MetricsRegistry* registry) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> started = Start(registry);
  if (!started.ok()) {
    spdlog::error("metrics: {}", started.status().ToString());
  } else if (*started != nullptr) {
    spdlog::info("metrics on {}", (*started)->url());
  }
  return started;
}

int MetricsExitStatus(const absl::Status& error) {
  return absl::IsInvalidArgument(error) || absl::IsFailedPrecondition(error)
             ? 2
             : 1;
}

}  // namespace server
}  // namespace muonps
