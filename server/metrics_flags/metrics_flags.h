// The /metrics flags that muonps-coordinator and muonps-worker share
// (--metrics_address, --metrics_port, --metrics_token_file,
// --metrics_tls_cert, --metrics_tls_key), defined once here, and the one
// call that starts the metrics server they describe. For the binaries' main
// thread only; the returned server is thread-safe as MetricsServer is.
#ifndef MUONPS_SERVER_METRICS_FLAGS_METRICS_FLAGS_H_
#define MUONPS_SERVER_METRICS_FLAGS_METRICS_FLAGS_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/metrics_server/metrics_server.h"

namespace muonps {
namespace server {

// Serves `registry` (which must outlive the server) as the flags say, or
// returns null when --metrics_port is -1; logs where it serves, or the
// error. INVALID_ARGUMENT or FAILED_PRECONDITION naming the flag for bad
// flags (MetricsServerOptionsFromFlags); MetricsServer::Start's error when
// it cannot listen.
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsServerFromFlags(
    MetricsRegistry* registry);

// The exit status a binary ends with on StartMetricsServerFromFlags's
// `error`: 2 for bad flags (INVALID_ARGUMENT, FAILED_PRECONDITION), 1 when
// it cannot listen.
int MetricsExitStatus(const absl::Status& error);

}  // namespace server
}  // namespace muonps

#endif  // MUONPS_SERVER_METRICS_FLAGS_METRICS_FLAGS_H_
