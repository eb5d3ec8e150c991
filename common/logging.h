// Logging setup for muonps binaries (spdlog).
//
// Each binary calls SetUpLogging once from main(), before starting threads;
// every component then logs through spdlog's default logger. Log lines carry
// the ids that let a person follow an event (job=, plan_version=, step=,
// worker=); nothing above debug level is logged on a per-step hot path.
#ifndef MUONPS_COMMON_LOGGING_H_
#define MUONPS_COMMON_LOGGING_H_

#include <string>

#include "absl/status/status.h"

namespace muonps {

struct LoggingOptions {
  // Shown in every line, e.g. "coordinator" or "worker-3".
  std::string component = "muonps";
  // One of trace, debug, info, warn, error, critical, off.
  std::string level = "info";
  // If non-empty, lines are also appended to this file.
  std::string file;
};

// Installs a stderr (and optional file) logger as spdlog's default.
// Returns INVALID_ARGUMENT naming `level` if it is not a known level, and
// UNAVAILABLE if `file` cannot be opened; the previous logger stays then.
absl::Status SetUpLogging(const LoggingOptions& options);

}  // namespace muonps

#endif  // MUONPS_COMMON_LOGGING_H_
