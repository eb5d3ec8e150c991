// muonps-worker's command-line flags, defined once here (main.cc reads
// them), and what --test_pause_at means: the chaos tests' step hook.
#include "server/worker/worker_flags.h"

#include <signal.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, coordinator, "", "Coordinator address, HOST:PORT.");
ABSL_FLAG(std::string, job, "", "Job to join.");
ABSL_FLAG(std::string, worker_id, "",
          "Worker id, unique in the job (default: HOSTNAME-PID).");
ABSL_FLAG(std::string, socket, "",
          "Unix socket of the local control service (default: "
          "$XDG_RUNTIME_DIR/muonps/worker-ID.sock, else "
          "/tmp/muonps-UID/worker-ID.sock, in a directory private to this "
          "user).");
ABSL_FLAG(std::string, allow_group, "",
          "Also let processes of this group (primary or supplementary) talk "
          "to the socket; by default only this worker's user may.");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address of the data-plane port (--data_port).");
ABSL_FLAG(std::string, node, "",
          "The machine this worker runs on, as the plan groups workers "
          "(workers of one node share its NVLink); default: the kernel's "
          "boot id, which every container of the machine shares.");
ABSL_FLAG(double, network_gbs, 0,
          "This worker's network bandwidth to other nodes, GB/s per "
          "direction, as the plan weighs it; 0: its host's active "
          "InfiniBand/RoCE ports (else its fastest Ethernet interface that "
          "is up) over the GPUs it sees, from /sys.");
ABSL_FLAG(std::string, device, "auto",
          "cpu, cuda:N, or auto (cuda:0 when a GPU is usable, else cpu). "
          "A GPU worker takes its trainer's CUDA buffers by CUDA IPC and "
          "talks to the other GPU workers over NCCL; a CPU worker takes "
          "shared memory and TCP.");
ABSL_FLAG(std::string, gpu_transport, "nccl",
          "How GPU workers move tensors: nccl (one rank per GPU) or ipc "
          "(same-host CUDA IPC peer copies: several workers on one GPU, or "
          "no NCCL). Every worker of a job must use the same.");
ABSL_FLAG(bool, peer_writes, true,
          "Owners write Muon updates straight into the staging of the "
          "trainers of their host (CUDA IPC peer copies on a GPU, shared "
          "memory on the CPU) instead of broadcasting them. Workers that "
          "cannot open each other's memory fall back to the transport.");
ABSL_FLAG(std::string, apply_early, "plan",
          "Whether Muon updates go into the trainer's parameters before the "
          "commit where a killed worker's step would be lost anyway (no "
          "checkpoint due, no momentum reset allowed, no owner groups): a "
          "worker alone as each one lands, several after their last "
          "Newton-Schulz, undone unless the step commits. plan: where the "
          "plan's clock found that faster (Plan.apply_at_commit); always; "
          "never: every update at the commit, after the votes.");
ABSL_FLAG(std::string, precision, "",
          "Newton-Schulz precision: bf16 (as torch.optim.Muon), fp16 or fp32. "
          "On a GPU the GEMM inputs (accumulation is fp32); on the CPU, which "
          "iterates in fp32, the update's rounding. The update is the result "
          "rounded to it, and moves and waits in it. Empty: bf16 on a GPU, "
          "fp32 on the CPU. Every worker of a job must use the same.");
ABSL_FLAG(int64_t, memory_bytes, 0,
          "Device memory the worker may use; 0: the GPU's free memory (8 GiB "
          "on the CPU).");
ABSL_FLAG(bool, colocated, true, "Shares its device with a trainer rank.");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{1} << 30,
          "Largest gRPC message on the local socket (a matrix's momentum "
          "travels in one); at most 2 GiB - 1.");
ABSL_FLAG(bool, dedicated, false,
          "No trainer attaches to this worker (a GPU of a dedicated "
          "optimizer pool): it owns matrices and steps whenever the "
          "trainers' workers do.");
ABSL_FLAG(std::string, cost_table, "",
          "File of measured Newton-Schulz times (scheduler/cost_table.h).");
ABSL_FLAG(double, speed, 1.0, "Speed relative to the cost table.");
ABSL_FLAG(int, data_port, 0,
          "TCP port of the data-plane transport (on --host); 0 picks one.");
ABSL_FLAG(int64_t, io_timeout_ms, 10000,
          "A peer silent this long during a step fails the step.");
ABSL_FLAG(int, max_threads, 32,
          "Threads the local gRPC server may use; calls beyond them wait or "
          "are refused (RESOURCE_EXHAUSTED).");
ABSL_FLAG(int, max_concurrent_streams, 64,
          "Concurrent calls per connection on the local socket.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token: sent to the coordinator, and "
          "required of every call on the local socket (default: "
          "$MUONPS_TOKEN_FILE).");
ABSL_FLAG(std::string, tls_ca_file, "",
          "CA of the coordinator's certificate: turns on TLS to it (default: "
          "$MUONPS_TLS_CA_FILE).");
ABSL_FLAG(std::string, tls_cert_file, "",
          "This worker's client certificate, for a coordinator that requires "
          "mutual TLS (default: $MUONPS_TLS_CERT_FILE).");
ABSL_FLAG(std::string, tls_key_file, "",
          "Its private key (default: $MUONPS_TLS_KEY_FILE).");
ABSL_FLAG(int64_t, call_timeout_ms, 120000,
          "A CPU data-plane call (a step's grouped transfers) not done this "
          "long after it began fails the step, however its bytes trickle.");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM or SIGINT (or `muonps drain`), hand the owned momentum "
          "to the other workers before leaving: ask the coordinator for a "
          "plan in which this worker owns nothing and wait this long at most "
          "for a step to commit under it. A second signal cuts it short; 0 "
          "leaves at once.");
ABSL_FLAG(std::string, test_pause_at, "",
          "Chaos tests only: POINT@STEP[@rankN] stops this process (SIGSTOP) "
          "at that point of that step id (with plan rank N): exchange, "
          "transfer, prepared, committed or decided "
          "(server/worker/step_commit.h).");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error.");
ABSL_FLAG(std::string, log_file, "", "Also append logs to this file.");

namespace muonps {
namespace worker {

// --test_pause_at: the chaos tests stop the worker at one point of one
// step (when it has plan rank RANK, if given), then kill it (kill -9) or let
// it go on (SIGCONT).
absl::StatusOr<worker::StepHook> PauseHook(const std::string& flag) {
  const std::vector<std::string> parts = absl::StrSplit(flag, '@');
  int64_t step = -1;
  int rank = -1;
  if (parts.size() < 2 || parts.size() > 3 ||
      !absl::SimpleAtoi(parts[1], &step) ||
      (parts.size() == 3 && (!absl::StartsWith(parts[2], "rank") ||
                             !absl::SimpleAtoi(parts[2].substr(4), &rank)))) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected POINT@STEP or POINT@STEP@rankN"));
  }
  for (worker::StepPoint p :
       {worker::StepPoint::kExchange, worker::StepPoint::kTransfer,
        worker::StepPoint::kPrepared, worker::StepPoint::kCommitted,
        worker::StepPoint::kDecided}) {
    if (parts[0] != worker::StepPointName(p)) continue;
    auto paused = std::make_shared<std::atomic<bool>>(false);
    return worker::StepHook(
        [p, step, rank, paused](worker::StepPoint reached, int64_t id, int at) {
          if (reached != p || id != step || (rank >= 0 && at != rank)) return;
          if (paused->exchange(true)) return;  // once: retries run through
          spdlog::warn("step={} rank={} paused at {} (--test_pause_at)", id, at,
                       worker::StepPointName(p));
          spdlog::default_logger()->flush();
          raise(SIGSTOP);
        });
  }
  return absl::InvalidArgumentError(absl::StrCat(
      parts[0], ": not exchange, transfer, prepared or committed"));
}

}  // namespace worker
}  // namespace muonps
