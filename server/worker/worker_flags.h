// muonps-worker's command-line flags (worker_flags.cc defines and
// documents each; `muonps-worker --helpfull` lists them), declared for its
// main.cc, the only reader: configuration reaches the worker's parts as
// structs built there. Also PauseHook, which turns --test_pause_at into
// the engine's step hook. Flags are read on the main thread only; the hook
// may be called from any thread.
#ifndef MUONPS_SERVER_WORKER_WORKER_FLAGS_H_
#define MUONPS_SERVER_WORKER_WORKER_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "server/worker/step_commit.h"

ABSL_DECLARE_FLAG(std::string, coordinator);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(std::string, worker_id);
ABSL_DECLARE_FLAG(std::string, socket);
ABSL_DECLARE_FLAG(std::string, allow_group);
ABSL_DECLARE_FLAG(std::string, host);
ABSL_DECLARE_FLAG(std::string, node);
ABSL_DECLARE_FLAG(double, network_gbs);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, gpu_transport);
ABSL_DECLARE_FLAG(bool, peer_writes);
ABSL_DECLARE_FLAG(std::string, apply_early);
ABSL_DECLARE_FLAG(std::string, precision);
ABSL_DECLARE_FLAG(int64_t, memory_bytes);
ABSL_DECLARE_FLAG(bool, colocated);
ABSL_DECLARE_FLAG(int64_t, max_message_bytes);
ABSL_DECLARE_FLAG(bool, dedicated);
ABSL_DECLARE_FLAG(std::string, cost_table);
ABSL_DECLARE_FLAG(double, speed);
ABSL_DECLARE_FLAG(int, data_port);
ABSL_DECLARE_FLAG(int64_t, io_timeout_ms);
ABSL_DECLARE_FLAG(int, max_threads);
ABSL_DECLARE_FLAG(int, max_concurrent_streams);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, tls_ca_file);
ABSL_DECLARE_FLAG(std::string, tls_cert_file);
ABSL_DECLARE_FLAG(std::string, tls_key_file);
ABSL_DECLARE_FLAG(int64_t, call_timeout_ms);
ABSL_DECLARE_FLAG(absl::Duration, drain_timeout);
ABSL_DECLARE_FLAG(std::string, test_pause_at);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, log_file);

namespace muonps {
namespace worker {

// The hook --test_pause_at=POINT@STEP[@rankN] asks for: it stops this
// process (SIGSTOP) the first time the step reaches POINT (exchange,
// transfer, prepared or committed) with id STEP, and plan rank N if given.
// INVALID_ARGUMENT naming the malformed part otherwise.
absl::StatusOr<StepHook> PauseHook(const std::string& flag);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_WORKER_FLAGS_H_
