// muonps-coordinator: serves muonps.v1.Coordinator (with grpc.health.v1 and
// server reflection) and Prometheus metrics; expires leases and re-plans.
// With --state_dir its state is durable (server/coordinator/job_store.h):
// a restart on the same directory carries on where it stopped, and a second
// coordinator on it exits with status 2. Logs "listening on HOST:PORT" once
// it serves; exits cleanly on SIGTERM or SIGINT, and with status 1 when a
// state store write fails (memory and disk then differ: a restart reloads
// the last durable state).
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/logging.h"
#include "common/metrics.h"
#include "common/planner_malloc.h"
#include "proto/credentials.h"
#include "server/coordinator/coordinator.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/job_store.h"
#include "server/health/health_service.h"
#include "server/metrics_flags/metrics_flags.h"
#include "server/reflection/reflection_service.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address of the gRPC port.");
ABSL_FLAG(int, port, 0, "gRPC port; 0 picks a free one.");
ABSL_FLAG(int64_t, lease_ttl_ms, 6000,
          "A worker's lease expires this long after its last heartbeat.");
ABSL_FLAG(int64_t, heartbeat_interval_ms, 1000,
          "How often workers are told to heartbeat.");
ABSL_FLAG(int, plan_history, 16, "Plan versions kept per job.");
ABSL_FLAG(double, nvlink_gbs, 300,
          "GB/s per GPU per direction between the GPUs of one node, as plans "
          "weigh it (NCCL's bus bandwidth there).");
ABSL_FLAG(double, network_gbs, 50,
          "GB/s per GPU per direction between nodes, as plans weigh it "
          "(each GPU's share of its node's network ports).");
ABSL_FLAG(double, network_hop_us, 3.4,
          "Microseconds a message takes across one network hop, as plans "
          "weigh it: each ring a step runs over every rank pays one per rank, "
          "which is what the two-level sum of unreduced gradients across "
          "nodes saves (Plan.exchange_nodes).");
ABSL_FLAG(double, rebalance_tolerance, 0.05,
          "How far above the mean (0.05: 5%) the busiest GPU worker's "
          "measured Newton-Schulz may run before its job re-plans with the "
          "speeds its workers measured; 0: plans use the cost tables only.");
ABSL_FLAG(std::string, state_dir, "",
          "Directory of the durable state: jobs, members and their tokens, "
          "plan versions, NCCL ids (SQLite, fsynced before every change is "
          "acknowledged; locked by one coordinator at a time). A restart on "
          "it continues where the last one stopped. Empty: memory only, "
          "lost on restart.");
ABSL_FLAG(int64_t, max_jobs, 1000, "Jobs the coordinator holds at most.");
ABSL_FLAG(int64_t, max_matrices_per_job, 1000000,
          "Matrices per job, each expert counted.");
ABSL_FLAG(int64_t, max_parameters_per_job, int64_t{1} << 44,
          "Parameters per job.");
ABSL_FLAG(int64_t, max_dim, 1 << 20, "Largest matrix dimension.");
ABSL_FLAG(int64_t, max_experts, 65536, "Largest expert stack.");
ABSL_FLAG(int64_t, max_name_bytes, 256, "Longest matrix name.");
ABSL_FLAG(int64_t, max_workers_per_job, 4096, "Workers per job.");
ABSL_FLAG(int64_t, max_message_bytes, 256 << 20,
          "Largest request the server accepts.");
ABSL_FLAG(int, max_concurrent_streams, 256,
          "Concurrent calls per client connection (HTTP/2 streams).");
ABSL_FLAG(int, max_threads, 64,
          "Threads the gRPC server may use; calls beyond them wait or are "
          "refused (RESOURCE_EXHAUSTED), so a flood cannot exhaust the "
          "process.");
ABSL_FLAG(int, max_watch_streams, 32,
          "Open WatchPlan streams at most (each holds a thread); more are "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token every RPC but health must carry "
          "(default: $MUONPS_TOKEN_FILE).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "TLS certificate chain (default: $MUONPS_TLS_CERT_FILE).");
ABSL_FLAG(std::string, tls_key_file, "",
          "TLS private key (default: $MUONPS_TLS_KEY_FILE).");
ABSL_FLAG(std::string, tls_client_ca_file, "",
          "CA of client certificates: turns on mutual TLS (default: "
          "$MUONPS_TLS_CLIENT_CA_FILE).");
ABSL_FLAG(bool, insecure, false,
          "Serve plaintext gRPC (loopback only; logged as a warning).");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error.");
ABSL_FLAG(std::string, log_file, "", "Also append logs to this file.");

namespace muonps {
namespace {

coordinator::CoordinatorOptions OptionsFromFlags() {
  coordinator::CoordinatorOptions o;
  o.lease_ttl = absl::Milliseconds(absl::GetFlag(FLAGS_lease_ttl_ms));
  o.heartbeat_interval =
      absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_interval_ms));
  o.plan_history = absl::GetFlag(FLAGS_plan_history);
  o.links.nvlink_gbs = absl::GetFlag(FLAGS_nvlink_gbs);
  o.links.inter_node_gbs = absl::GetFlag(FLAGS_network_gbs);
  o.links.hop_latency_us = absl::GetFlag(FLAGS_network_hop_us);
  o.rebalance_tolerance = absl::GetFlag(FLAGS_rebalance_tolerance);
  o.limits.max_jobs = absl::GetFlag(FLAGS_max_jobs);
  o.limits.max_matrices_per_job = absl::GetFlag(FLAGS_max_matrices_per_job);
  o.limits.max_parameters_per_job = absl::GetFlag(FLAGS_max_parameters_per_job);
  o.limits.max_dim = absl::GetFlag(FLAGS_max_dim);
  o.limits.max_experts = absl::GetFlag(FLAGS_max_experts);
  o.limits.max_name_bytes = absl::GetFlag(FLAGS_max_name_bytes);
  o.limits.max_workers_per_job = absl::GetFlag(FLAGS_max_workers_per_job);
  o.limits.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  return o;
}

int Run() {
  // Signals go to the main thread's sigwait, not to gRPC's threads.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const coordinator::CoordinatorOptions options = OptionsFromFlags();
  if (options.lease_ttl <= absl::ZeroDuration() ||
      options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_interval >= options.lease_ttl) {
    spdlog::error("--heartbeat_interval_ms must be in (0, --lease_ttl_ms)");
    return 2;
  }
  if (!(options.links.nvlink_gbs > 0) || !(options.links.inter_node_gbs > 0) ||
      !std::isfinite(options.links.nvlink_gbs) ||
      !std::isfinite(options.links.inter_node_gbs)) {
    spdlog::error("--nvlink_gbs and --network_gbs must be finite and > 0");
    return 2;
  }
  if (!(options.links.hop_latency_us >= 0) ||
      !std::isfinite(options.links.hop_latency_us)) {
    spdlog::error("--network_hop_us must be finite and >= 0");
    return 2;
  }
  if (!(options.rebalance_tolerance >= 0) ||
      !std::isfinite(options.rebalance_tolerance)) {
    spdlog::error("--rebalance_tolerance must be finite and >= 0");
    return 2;
  }
  const std::string host = absl::GetFlag(FLAGS_host);
  absl::StatusOr<ServerSecurity> security = LoadServerSecurity(
      WithEnvironmentDefaults(
          {.token_file = absl::GetFlag(FLAGS_token_file),
           .tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file),
           .tls_key_file = absl::GetFlag(FLAGS_tls_key_file),
           .tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca_file),
           .insecure = absl::GetFlag(FLAGS_insecure)}),
      host);
  if (!security.ok()) {
    spdlog::error("{}", std::string(security.status().message()));
    return 2;
  }
  MetricsRegistry metrics;
  std::unique_ptr<coordinator::Coordinator> opened;
  const std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) {
    opened = std::make_unique<coordinator::Coordinator>(options);
  } else {
    absl::StatusOr<std::unique_ptr<coordinator::JobStore>> store =
        coordinator::JobStore::Open(state_dir);
    if (!store.ok()) {
      spdlog::error("{}", store.status().ToString());
      return 2;
    }
    absl::StatusOr<std::unique_ptr<coordinator::Coordinator>> loaded =
        coordinator::Coordinator::Open(options, *std::move(store));
    if (!loaded.ok()) {
      spdlog::error("--state_dir={}: {}", state_dir,
                    loaded.status().ToString());
      return 1;
    }
    opened = *std::move(loaded);
  }
  coordinator::Coordinator& state = *opened;
  Histogram* store_writes = metrics.AddHistogram(
      "muonps_coordinator_store_write_seconds",
      "Commits of the durable state (--state_dir), fsync included.");
  state.set_store_write_observer([store_writes](double seconds, size_t) {
    store_writes->Observe(seconds);
  });
  coordinator::CoordinatorService service(
      &state, &metrics, security->token,
      absl::GetFlag(FLAGS_max_watch_streams));

  server::HealthService health;
  server::ReflectionService reflection(
      {"muonps.v1.Coordinator", "grpc.health.v1.Health",
       "grpc.reflection.v1alpha.ServerReflection"},
      security->token);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", absl::GetFlag(FLAGS_port)),
                           security->credentials, &port);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(options.limits.max_message_bytes));
  builder.SetMaxSendMessageSize(
      static_cast<int>(options.limits.max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             absl::GetFlag(FLAGS_max_concurrent_streams));
  grpc::ResourceQuota quota("muonps-coordinator");
  quota.SetMaxThreads(absl::GetFlag(FLAGS_max_threads));
  builder.SetResourceQuota(quota);
  builder.RegisterService(&service);
  builder.RegisterService(&health);
  builder.RegisterService(&reflection);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    spdlog::error("cannot listen on {}:{}", host, absl::GetFlag(FLAGS_port));
    return 1;
  }
  health.SetServing("muonps.v1.Coordinator", true);
  absl::StatusOr<std::unique_ptr<MetricsServer>> started =
      server::StartMetricsServerFromFlags(&metrics);
  if (!started.ok()) return server::MetricsExitStatus(started.status());
  std::unique_ptr<MetricsServer> metrics_server = *std::move(started);
  spdlog::info("listening on {}:{} ({}{}; state {})", host, port,
               security->tls ? "TLS" : "plaintext",
               security->token.empty() ? "" : ", bearer token",
               state_dir.empty() ? "in memory only, lost on restart"
                                 : "in " + state_dir);

  absl::Notification stop;
  std::atomic<bool> store_failed{false};
  std::thread lease_monitor([&] {
    const absl::Duration period = options.heartbeat_interval / 2;
    while (!stop.WaitForNotificationWithTimeout(period)) {
      service.CountLostLeases(
          static_cast<int>(state.membership().ExpireLeases().size()));
      service.UpdateGauges();
      const absl::Status store = state.store_status();
      if (!store.ok() && !store_failed.exchange(true)) {
        spdlog::critical(
            "state store failed ({}): exiting so that a restart reloads the "
            "last durable state",
            store.ToString());
        kill(getpid(), SIGTERM);  // to the sigwait below
      }
    }
  });

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info("signal {}: shutting down", signal_number);
  stop.Notify();
  service.Shutdown();
  health.Shutdown();  // ends Watch streams before the server waits on them
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  lease_monitor.join();
  metrics_server.reset();
  spdlog::info("stopped");
  return store_failed ? 1 : 0;
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  // Plans of many matrices first touch tens of megabytes: one heap, on
  // huge pages (common/planner_malloc.h).
  muonps::RestartWithPlannerMalloc(argv);
  absl::SetProgramUsageMessage(
      "muonps-coordinator: jobs, worker leases and ownership plans.\n"
      "Usage: muonps-coordinator [--port N] [--metrics_address HOST:PORT] "
      "[--state_dir DIR]");
  absl::ParseCommandLine(argc, argv);
  const absl::Status logging =
      muonps::SetUpLogging({.component = "coordinator",
                            .level = absl::GetFlag(FLAGS_log_level),
                            .file = absl::GetFlag(FLAGS_log_file)});
  if (!logging.ok()) {
    std::fprintf(stderr, "%s\n", logging.ToString().c_str());
    return 2;
  }
  return muonps::Run();
}
