// muonps-worker: joins a job through the coordinator, keeps its lease,
// follows the job's plan, and serves the local muonps.v1.Worker control
// service on a Unix socket (with grpc.health.v1 and reflection) plus
// Prometheus metrics. Logs "listening on unix:PATH" once it serves; exits
// cleanly (leaving the job) on SIGTERM or SIGINT. Its flags are defined in
// worker_flags.cc; this file turns them into the worker's parts and runs
// them.
#include <grpcpp/grpcpp.h>
#include <grpcpp/server_posix.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/device.h"
#include "common/logging.h"
#include "common/machine.h"
#include "common/metrics.h"
#include "common/network_links.h"
#include "common/status.h"
#include "kernels/cuda/precision.h"
#include "lending/trainer_segment.h"
#include "proto/credentials.h"
#include "server/health/health_service.h"
#include "server/metrics_flags/metrics_flags.h"
#include "server/reflection/reflection_service.h"
#include "server/worker/cuda_step_backend.h"
#include "server/worker/local_listener.h"
#include "server/worker/nccl_bootstrap.h"
#include "server/worker/worker_agent.h"
#include "server/worker/worker_flags.h"
#include "server/worker/worker_service.h"
#include "spdlog/spdlog.h"
#include "transport/counting_transport.h"
#include "transport/cuda_ipc_transport.h"
#include "transport/split_transport.h"
#include "transport/tcp_transport.h"

namespace muonps {
namespace {

std::string Hostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

int Run() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  worker::AgentOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.job = absl::GetFlag(FLAGS_job);
  if (options.coordinator.empty() || options.job.empty()) {
    spdlog::error("--coordinator and --job are required");
    return 2;
  }
  const SecurityConfig security = WithEnvironmentDefaults(
      {.token_file = absl::GetFlag(FLAGS_token_file),
       .tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file),
       .tls_key_file = absl::GetFlag(FLAGS_tls_key_file),
       .tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file)});
  std::string token;
  if (!security.token_file.empty()) {
    absl::StatusOr<std::string> read =
        ReadToken(security.token_file, "--token_file");
    if (!read.ok()) {
      spdlog::error("{}", std::string(read.status().message()));
      return 2;
    }
    token = *std::move(read);
  }
  grpc::ChannelArguments coordinator_args;
  // Plans of big jobs exceed gRPC's 4 MiB default.
  coordinator_args.SetMaxReceiveMessageSize(256 << 20);
  absl::StatusOr<std::shared_ptr<grpc::Channel>> coordinator_channel =
      OpenChannel(options.coordinator, security, coordinator_args);
  if (!coordinator_channel.ok()) {
    spdlog::error("{}", std::string(coordinator_channel.status().message()));
    return 2;
  }
  options.coordinator_channel = *coordinator_channel;
  options.credentials = std::make_shared<worker::JoinCredentials>();
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  if (options.worker_id.empty()) {
    options.worker_id = absl::StrCat(Hostname(), "-", getpid());
  }
  std::string device_flag = absl::GetFlag(FLAGS_device);
  if (device_flag == "auto") {
    device_flag = worker::CudaDeviceUsable(0) ? "cuda:0" : "cpu";
  }
  absl::StatusOr<Device> device = ParseDevice(device_flag);
  if (!device.ok()) {
    spdlog::error("--device: {}", device.status().ToString());
    return 2;
  }
  options.device.set_host(Hostname());
  const std::string node = absl::GetFlag(FLAGS_node);
  options.device.set_node(node.empty() ? MachineIdentity() : node);
  options.device.set_kind("cpu");
  options.device.set_memory_bytes(absl::GetFlag(FLAGS_memory_bytes));
  options.device.set_colocated(absl::GetFlag(FLAGS_colocated));
  if (device->is_cuda()) {
    const absl::Status described =
        worker::DescribeCudaDevice(device->ordinal, &options.device);
    if (!described.ok()) {
      spdlog::error("--device={}: {}", device_flag, described.ToString());
      return 1;
    }
  } else if (options.device.memory_bytes() <= 0) {
    options.device.set_memory_bytes(int64_t{8} << 30);
  }
  const double network_gbs = absl::GetFlag(FLAGS_network_gbs);
  if (!std::isfinite(network_gbs) || network_gbs < 0) {
    spdlog::error("--network_gbs: {} must be finite and >= 0", network_gbs);
    return 2;
  }
  // Its share of the host's ports: the GPUs it sees share them.
  const int gpus = device->is_cuda() ? std::max(1, worker::CudaDevices()) : 1;
  options.device.set_network_gbs(
      network_gbs > 0 ? network_gbs : HostNetworkGbs("/sys") / gpus);
  spdlog::info("network to other nodes: {} GB/s{}",
               options.device.network_gbs(),
               network_gbs > 0 ? " (--network_gbs)"
               : options.device.network_gbs() > 0
                   ? absl::StrCat(" (the host's ports over ", gpus, " GPUs)")
                   : std::string(" unknown: the coordinator's figure"));
  options.speed = absl::GetFlag(FLAGS_speed);
  options.dedicated = absl::GetFlag(FLAGS_dedicated);
  // An operator's `muonps drain`: the same path as SIGTERM.
  options.on_drain_requested = [] { kill(getpid(), SIGTERM); };
  absl::StatusOr<std::unique_ptr<transport::TcpListener>> listener =
      transport::TcpListener::Bind(absl::GetFlag(FLAGS_host),
                                   absl::GetFlag(FLAGS_data_port));
  if (!listener.ok()) {
    spdlog::error("--data_port: {}", listener.status().ToString());
    return 1;
  }
  options.data_address =
      absl::StrCat(absl::GetFlag(FLAGS_host), ":", (*listener)->port());
  const std::string table_path = absl::GetFlag(FLAGS_cost_table);
  if (!table_path.empty()) {
    std::ifstream in(table_path);
    if (!in) {
      spdlog::error("--cost_table: cannot open \"{}\"", table_path);
      return 2;
    }
    options.cost_table.assign(std::istreambuf_iterator<char>(in),
                              std::istreambuf_iterator<char>());
  }
  // The socket is the trainer's door to its buffers: the worker accepts on
  // it itself and lets in only its own user (or --allow_group), checked by
  // SO_PEERCRED, then hands the connection to the gRPC server below.
  std::optional<gid_t> allowed_group;
  if (!absl::GetFlag(FLAGS_allow_group).empty()) {
    absl::StatusOr<gid_t> group =
        worker::GroupId(absl::GetFlag(FLAGS_allow_group));
    if (!group.ok()) {
      spdlog::error("--allow_group: {}", group.status().ToString());
      return 2;
    }
    allowed_group = *group;
  }
  absl::StatusOr<std::unique_ptr<worker::LocalListener>> local_listener =
      worker::OpenWorkerSocket(absl::GetFlag(FLAGS_socket), options.worker_id,
                               allowed_group);
  if (!local_listener.ok()) {
    spdlog::error("--socket: {}", local_listener.status().ToString());
    return 1;
  }
  const std::string socket = (*local_listener)->path();
  // Segments of trainers killed by SIGKILL keep their memory until removed.
  absl::StatusOr<int> stale =
      RemoveStaleTrainerSegments("/dev/shm", options.job, geteuid());
  if (!stale.ok()) {
    spdlog::warn("stale trainer segments: {}", stale.status().ToString());
  } else if (*stale > 0) {
    spdlog::info("removed {} shared-memory segments of dead trainers", *stale);
  }

  transport::TcpOptions tcp;
  tcp.io_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_io_timeout_ms));
  tcp.connect_timeout = tcp.io_timeout;
  tcp.call_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_call_timeout_ms));
  transport::TcpListener* data_listener = listener->get();
  worker::StepBackend backend;
  worker::TransportFactory make_transport;
  // The data plane's TCP mesh: a CPU worker's transport; on a GPU, where
  // the control messages go beside NCCL (a star around rank 0: every
  // control message has rank 0 at one end) or the CUDA IPC transport.
  const auto connect_tcp = [data_listener, tcp](
                               transport::MeshShape shape, int rank,
                               const std::vector<std::string>& addresses,
                               uint64_t session, const std::string& secret) {
    transport::TcpOptions options = tcp;
    options.data_plane_secret = secret;
    options.shape = shape;
    return transport::TcpTransport::Connect(data_listener, rank, addresses,
                                            session, options);
  };
  // A transport factory that connects the TCP mesh of the plan version and
  // makes the version's transport of it with `build`.
  using BuildOnTcp =
      std::function<absl::StatusOr<std::unique_ptr<transport::Transport>>(
          std::unique_ptr<transport::TcpTransport> tcp, int rank,
          const std::vector<std::string>& addresses, uint64_t session,
          const std::string& secret)>;
  const auto over_tcp = [connect_tcp](transport::MeshShape shape,
                                      BuildOnTcp build) {
    return [connect_tcp, shape, build = std::move(build)](
               int rank, const std::vector<std::string>& addresses,
               uint64_t session, const std::string& secret)
               -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
      MUONPS_ASSIGN_OR_RETURN(
          std::unique_ptr<transport::TcpTransport> tcp,
          connect_tcp(shape, rank, addresses, session, secret));
      return build(std::move(tcp), rank, addresses, session, secret);
    };
  };
  if (device->is_cuda()) {
    const std::string named = absl::GetFlag(FLAGS_precision);
    absl::StatusOr<kernels::cuda::Precision> precision =
        kernels::cuda::ParsePrecision(named.empty() ? "bf16" : named);
    if (!precision.ok()) {
      spdlog::error("--precision: {}", precision.status().ToString());
      return 2;
    }
    absl::StatusOr<worker::StepBackend> cuda =
        worker::CudaStepBackend({.device = device->ordinal,
                                 .precision = *precision,
                                 .timeout = tcp.io_timeout});
    if (!cuda.ok()) {
      spdlog::error("--device={}: {}", device_flag, cuda.status().ToString());
      return 1;
    }
    backend = *std::move(cuda);
    const std::string gpu_transport = absl::GetFlag(FLAGS_gpu_transport);
    if (gpu_transport != "nccl" && gpu_transport != "ipc") {
      spdlog::error("--gpu_transport: \"{}\" is not nccl or ipc",
                    gpu_transport);
      return 2;
    }
    const int ordinal = device->ordinal;
    if (gpu_transport == "ipc") {
      make_transport = over_tcp(
          transport::MeshShape::Full(),
          [ordinal](std::unique_ptr<transport::TcpTransport> tcp, int,
                    const auto&, uint64_t, const std::string&)
              -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
            MUONPS_ASSIGN_OR_RETURN(
                std::unique_ptr<transport::CudaIpcTransport> ipc,
                transport::CudaIpcTransport::Create(ordinal, std::move(tcp)));
            return std::unique_ptr<transport::Transport>(std::move(ipc));
          });
    } else {
      // NCCL moves the tensors; the control messages go over the data
      // plane's TCP mesh beside it (transport/split_transport.h), so none
      // of them is a kernel spinning beside Newton-Schulz.
      make_transport = over_tcp(
          transport::MeshShape::Tree(worker::kControlTreeFanout),
          [nccl = worker::NcclTransportFactory(
               {.coordinator = options.coordinator_channel,
                .job = options.job,
                .worker_id = options.worker_id,
                .credentials = options.credentials,
                .cuda_device = device->ordinal,
                .timeout = tcp.io_timeout})](
              std::unique_ptr<transport::TcpTransport> control, int rank,
              const std::vector<std::string>& addresses, uint64_t session,
              const std::string& secret)
              -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
            MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> data,
                                    nccl(rank, addresses, session, secret));
            MUONPS_ASSIGN_OR_RETURN(
                std::unique_ptr<transport::SplitTransport> split,
                transport::SplitTransport::Create(std::move(data),
                                                  std::move(control)));
            return std::unique_ptr<transport::Transport>(std::move(split));
          });
    }
  } else {
    const std::string named = absl::GetFlag(FLAGS_precision);
    absl::StatusOr<kernels::cuda::Precision> precision =
        kernels::cuda::ParsePrecision(named.empty() ? "fp32" : named);
    if (!precision.ok()) {
      spdlog::error("--precision: {}", precision.status().ToString());
      return 2;
    }
    backend = worker::CpuStepBackend(tcp.io_timeout,
                                     kernels::cuda::PrecisionDType(*precision));
    make_transport =
        over_tcp(transport::MeshShape::Full(),
                 [](std::unique_ptr<transport::TcpTransport> tcp, int,
                    const auto&, uint64_t, const std::string&)
                     -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
                   return std::unique_ptr<transport::Transport>(std::move(tcp));
                 });
  }
  if (!absl::GetFlag(FLAGS_peer_writes)) backend.windows.reset();
  const absl::StatusOr<worker::EarlyApplyPolicy> apply_early =
      worker::EarlyApplyPolicyFromName(absl::GetFlag(FLAGS_apply_early));
  if (!apply_early.ok()) {
    spdlog::error("{}", std::string(apply_early.status().message()));
    return 2;
  }
  backend.apply_early = *apply_early;
  // Declared before the engine, whose transports count into it.
  MetricsRegistry metrics;
  // Every byte a step moves between workers, and every call and launch, is
  // counted here, in one place, whatever transport carries it.
  const transport::TransportCounters counters =
      transport::AddTransportCounters(&metrics);
  worker::TransportFactory counted_transport =
      [inner = std::move(make_transport), counters](
          int rank, const std::vector<std::string>& addresses, uint64_t session,
          const std::string& secret)
      -> absl::StatusOr<std::unique_ptr<transport::Transport>> {
    MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<transport::Transport> t,
                            inner(rank, addresses, session, secret));
    return std::unique_ptr<transport::Transport>(
        std::make_unique<transport::CountingTransport>(std::move(t), counters));
  };
  worker::StepEngine engine(options.worker_id, std::move(backend),
                            std::move(counted_transport));
  if (const std::string pause = absl::GetFlag(FLAGS_test_pause_at);
      !pause.empty()) {
    absl::StatusOr<worker::StepHook> hook = worker::PauseHook(pause);
    if (!hook.ok()) {
      spdlog::error("--test_pause_at: {}", hook.status().ToString());
      return 2;
    }
    engine.set_step_hook(*std::move(hook));
  }
  engine.EnableCheckpoints(&metrics);
  // Updates written into the peers' staging count with the transport's.
  engine.CountPeerWrites({counters.sent, counters.received, counters.calls});
  worker::WorkerAgent agent(options, &metrics, &engine);
  worker::WorkerService service(&agent, &engine, token);
  server::HealthService health;
  server::ReflectionService reflection(
      {"muonps.v1.Worker", "grpc.health.v1.Health",
       "grpc.reflection.v1alpha.ServerReflection"},
      token);
  grpc::ServerBuilder builder;
  // A matrix's momentum travels in one message (GetMomentum/SetMomentum):
  // gRPC's 4 MiB default stops at 1024 x 1024.
  const int64_t max_message_flag = absl::GetFlag(FLAGS_max_message_bytes);
  if (max_message_flag < (int64_t{4} << 20) || max_message_flag > INT32_MAX) {
    spdlog::error("--max_message_bytes: {} is not in [4 MiB, 2 GiB - 1]",
                  max_message_flag);
    return 2;
  }
  const int max_message = static_cast<int>(max_message_flag);
  builder.SetMaxReceiveMessageSize(max_message);
  builder.SetMaxSendMessageSize(max_message);
  // The socket serves this worker's trainers only: a few threads and
  // streams are plenty, and a runaway client cannot exhaust the process.
  grpc::ResourceQuota quota("muonps-worker");
  quota.SetMaxThreads(absl::GetFlag(FLAGS_max_threads));
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             absl::GetFlag(FLAGS_max_concurrent_streams));
  builder.RegisterService(&service);
  builder.RegisterService(&health);
  builder.RegisterService(&reflection);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    spdlog::error("cannot start the gRPC server for unix:{}", socket);
    return 1;
  }
  health.SetServing("muonps.v1.Worker", true);
  absl::StatusOr<std::unique_ptr<MetricsServer>> started =
      server::StartMetricsServerFromFlags(&metrics);
  if (!started.ok()) return server::MetricsExitStatus(started.status());
  std::unique_ptr<MetricsServer> metrics_server = *std::move(started);
  // Accepting starts last: no early return may leave the listener's
  // thread handing connections to a destroyed server.
  (*local_listener)->Start([&server](int fd) {
    grpc::AddInsecureChannelFromFd(server.get(), fd);
  });
  agent.Start();
  spdlog::info("worker={} on {} ({}), data plane on {}", options.worker_id,
               device_flag,
               options.device.name().empty() ? "host" : options.device.name(),
               options.data_address);
  spdlog::info("worker={} listening on unix:{}", options.worker_id, socket);
  if (device->is_cuda() &&
      absl::StartsWith(absl::GetFlag(FLAGS_host), "127.")) {
    // Peers on other hosts could not reach it, and a GPU job's control
    // messages go over TCP beside NCCL.
    spdlog::info(
        "worker={} data plane on loopback ({}): workers of this job on other "
        "hosts need --host set to an address they reach",
        options.worker_id, options.data_address);
  }

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  spdlog::info(
      "signal {}: handing the momentum over, leaving the job and "
      "shutting down (a second signal leaves at once)",
      signal_number);
  auto cut_short = std::make_shared<absl::Notification>();
  std::thread([signals, cut_short] {
    int again = 0;
    sigwait(&signals, &again);
    cut_short->Notify();
  }).detach();
  const absl::Status drained =
      agent.Drain(absl::GetFlag(FLAGS_drain_timeout), cut_short.get());
  if (!drained.ok()) {
    spdlog::warn("drain: {}; leaving anyway", drained.ToString());
  }
  agent.Stop();
  health.Shutdown();  // ends Watch streams before the server waits on them
  local_listener->reset();  // no new connections; removes the socket file
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  metrics_server.reset();
  spdlog::info("stopped");
  return 0;
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "muonps-worker: a GPU (or CPU) worker of a muonps job.\n"
      "Usage: muonps-worker --coordinator HOST:PORT --job NAME");
  absl::ParseCommandLine(argc, argv);
  const absl::Status logging =
      muonps::SetUpLogging({.component = "worker",
                            .level = absl::GetFlag(FLAGS_log_level),
                            .file = absl::GetFlag(FLAGS_log_file)});
  if (!logging.ok()) {
    std::fprintf(stderr, "%s\n", logging.ToString().c_str());
    return 2;
  }
  return muonps::Run();
}
