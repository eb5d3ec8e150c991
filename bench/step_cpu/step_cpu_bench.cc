// bench/step_cpu: one muonps optimizer step on the CPU backend, end to end,
// against the same kernels run in one process on the same matrices.
//
// Per --worker_openblas_threads value it starts the real binaries (a
// muonps-coordinator and --workers muonps-worker processes on loopback) and
// runs as many trainer ranks as threads of this process through
// muonps::Client (one per worker, layout unreduced: the DDP replacement).
// Between their steps, a peer thread steps the same matrices with
// CpuKernels::MuonStep one after another on the ranks' mean gradient (the
// one-process run, OpenBLAS on every core; the workers sit idle then). The
// two alternate step by step so that other load on a shared machine hits
// both alike. One JSON line per configuration:
//   muonps_step_ms        median over timed steps of the wall time from the
//                         first rank entering Client::Step to the last
//                         leaving it (the ranks enter together);
//   one_process_step_ms   median over the peer's steps in the same window;
//   bytes_moved_per_step  bytes one worker sent plus received in a step, as
//                         the worker reports it (rank 0's; _by_worker lists
//                         each);
//   ns_ms_per_worker      the slowest worker's Newton-Schulz milliseconds
//                         per step, from probe steps through the worker's
//                         Step RPC (Client::StepResult does not carry it);
//   foreign_cpu_fraction  the share of the machine's core-seconds that
//                         processes other than the bench and its children
//                         used meanwhile (a warning goes to stderr above
//                         5%);
//   parity_max_abs_diff   rank 0's parameters after every step against the
//                         peer's after as many steps.
// The workers share the machine's cores with each other and with the
// trainer threads, so the speedup is bounded by the cores ("cores").
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/common/coordinator_plan.h"
#include "bench/step_cpu/host_cpu.h"
#include "bench/step_cpu/loopback_cluster.h"
#include "bench/step_cpu/one_process_step.h"
#include "bench/step_cpu/step_model.h"
#include "bench/step_cpu/step_report.h"
#include "bench/step_cpu/trainer_rank.h"
#include "common/status.h"
#include "muonps/v1/plan.pb.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, widths, "1024,2560,2560,2560,1024",
          "MLP widths, input first; its weight matrices are the model.");
ABSL_FLAG(int, workers, 2, "Workers, and trainer ranks (one per worker).");
ABSL_FLAG(int, warmup_steps, 2, "Untimed steps first.");
ABSL_FLAG(int, steps, 5, "Timed steps.");
ABSL_FLAG(int, probe_steps, 3,
          "Steps after the timed ones through the worker's Step RPC, for "
          "the workers' Newton-Schulz time.");
ABSL_FLAG(std::string, worker_openblas_threads, "1,0",
          "Comma-separated OPENBLAS_NUM_THREADS values for the workers, one "
          "configuration (and JSON line) each; 0 leaves OpenBLAS's default.");
ABSL_FLAG(int, one_process_openblas_threads, 0,
          "OpenBLAS threads of the one-process peer; 0: every core.");
ABSL_FLAG(std::string, coordinator_binary, "",
          "muonps-coordinator (default: from this binary's runfiles, else "
          "bazel-bin/server/coordinator/muonps-coordinator).");
ABSL_FLAG(std::string, worker_binary, "",
          "muonps-worker (default: from this binary's runfiles, else "
          "bazel-bin/server/worker/muonps-worker).");
ABSL_FLAG(bool, keep_logs, false,
          "Keep the processes' logs in /tmp/muonps-step-cpu-*.");

namespace muonps {
namespace bench {
namespace {

// Above this share of the machine used by other processes, a run's timings
// say more about them than about muonps.
constexpr double kBusyHostFraction = 0.05;

std::string BinaryPath(const std::string& flag, const std::string& argv0,
                       const std::string& workspace_relative) {
  if (!flag.empty()) return flag;
  std::vector<std::string> candidates;
  if (const char* runfiles = std::getenv("RUNFILES_DIR")) {
    candidates.push_back(
        absl::StrCat(runfiles, "/muonps/", workspace_relative));
  }
  candidates.push_back(
      absl::StrCat(argv0, ".runfiles/muonps/", workspace_relative));
  for (const std::string& c : candidates) {
    if (std::filesystem::exists(c)) return c;
  }
  return absl::StrCat("bazel-bin/", workspace_relative);
}

// NS algorithm by matrix name, as the plan's batches chose.
using NsAlgorithms = std::map<std::string, NsAlgorithm>;

absl::StatusOr<NsAlgorithms> PlanAlgorithms(const std::string& coordinator,
                                            const std::string& job, int workers,
                                            int64_t* version) {
  MUONPS_ASSIGN_OR_RETURN(const v1::Plan plan, FetchPlan(coordinator, job));
  if (plan.workers_size() != workers) {
    return absl::FailedPreconditionError(absl::StrCat(
        "plan ", plan.version(), " has ", plan.workers_size(), " workers"));
  }
  *version = plan.version();
  NsAlgorithms algorithms;
  for (const v1::Batch& batch : plan.batches()) {
    for (const std::string& m : batch.matrices()) {
      algorithms[m] = batch.algorithm() == v1::NS_ALGORITHM_GRAM
                          ? NsAlgorithm::kGram
                          : NsAlgorithm::kNs5;
    }
  }
  return algorithms;
}

absl::StatusOr<InterleavedRun> RunInterleaved(
    const std::vector<StepMatrix>& matrices,
    const ClusterOptions& cluster_options, ChildCleanup* cleanup) {
  const ForeignCpuWindow window;
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<LoopbackCluster> cluster,
                          LoopbackCluster::Start(cluster_options, cleanup));
  const int ranks = cluster_options.workers;
  const int warmup = absl::GetFlag(FLAGS_warmup_steps);
  const int timed = absl::GetFlag(FLAGS_steps);
  const int steps = warmup + timed + absl::GetFlag(FLAGS_probe_steps);
  LockstepBarrier barrier(ranks + 1);
  std::vector<std::optional<absl::StatusOr<TrainerRankResult>>> results(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    TrainerRankOptions options{.coordinator = cluster->coordinator_address(),
                               .job = cluster_options.job,
                               .worker_socket = cluster->worker_socket(r),
                               .rank = r,
                               .ranks = ranks,
                               .workers = cluster_options.workers,
                               .matrices = matrices,
                               .warmup_steps = warmup,
                               .timed_steps = timed,
                               .probe_steps = absl::GetFlag(FLAGS_probe_steps)};
    threads.emplace_back([options, &barrier, &results, r] {
      results[r] = RunTrainerRank(options, &barrier);
    });
  }
  InterleavedRun run;
  run.worker_openblas_threads = cluster_options.worker_openblas_threads;
  // The peer, on this thread: it steps after the ranks' second wait of
  // every step (see trainer_rank.h).
  absl::Status peer_status = [&]() -> absl::Status {
    OneProcessStepper peer(matrices, ranks,
                           absl::GetFlag(FLAGS_one_process_openblas_threads));
    for (int s = 0; s < steps; ++s) {
      if (!barrier.Wait()) return absl::AbortedError("a rank failed");
      if (s == 0) {
        // Every rank saw the full plan before its first wait.
        MUONPS_ASSIGN_OR_RETURN(
            NsAlgorithms algorithms,
            PlanAlgorithms(cluster->coordinator_address(), cluster_options.job,
                           cluster_options.workers, &run.plan_version));
        run.algorithms = algorithms;
        peer.set_algorithms(std::move(algorithms));
      }
      if (!barrier.Wait()) return absl::AbortedError("a rank failed");
      MUONPS_ASSIGN_OR_RETURN(const double seconds, peer.Step());
      if (s >= warmup && s < warmup + timed) {
        run.peer_step_seconds.push_back(seconds);
      }
    }
    run.peer_final_params = peer.Parameters();
    return absl::OkStatus();
  }();
  if (!peer_status.ok()) barrier.Abort();
  for (std::thread& t : threads) t.join();
  run.foreign_cpu_fraction = window.ForeignFraction(cluster->pids());
  // The cause: a failure other than an abort (which only follows one).
  absl::Status failure;
  auto note = [&failure](const absl::Status& status) {
    if (failure.ok() || failure.code() == absl::StatusCode::kAborted) {
      failure = status;
    }
  };
  for (int r = 0; r < ranks; ++r) {
    if (!results[r]->ok()) note(results[r]->status());
  }
  if (!peer_status.ok()) note(Annotate(peer_status, "one-process peer"));
  if (!failure.ok()) {
    // The cluster's destructor keeps the logs of a failed run.
    return Annotate(failure, absl::StrCat("logs in ", cluster->folder()));
  }
  for (int r = 0; r < ranks; ++r) {
    run.ranks.push_back(*std::move(*results[r]));
  }
  MUONPS_RETURN_IF_ERROR(cluster->Stop());
  return run;
}

absl::Status Run(const std::string& argv0, ChildCleanup* cleanup) {
  MUONPS_ASSIGN_OR_RETURN(const std::vector<int64_t> widths,
                          ParseWidths(absl::GetFlag(FLAGS_widths)));
  MUONPS_ASSIGN_OR_RETURN(const std::vector<StepMatrix> matrices,
                          MlpMatrices(widths));
  if (absl::GetFlag(FLAGS_steps) < 1 || absl::GetFlag(FLAGS_warmup_steps) < 0 ||
      absl::GetFlag(FLAGS_probe_steps) < 1 ||
      absl::GetFlag(FLAGS_workers) < 1) {
    return InvalidField("steps",
                        "need steps >= 1, warmup_steps >= 0, probe_steps >= 1 "
                        "and workers >= 1");
  }
  std::vector<int> blas_threads;
  for (absl::string_view v :
       absl::StrSplit(absl::GetFlag(FLAGS_worker_openblas_threads), ',')) {
    int threads = 0;
    if (!absl::SimpleAtoi(v, &threads) || threads < 0) {
      return InvalidField("worker_openblas_threads",
                          absl::StrCat(Quoted(v), " is not an integer >= 0"));
    }
    blas_threads.push_back(threads);
  }
  const ReportContext context{
      .matrices = matrices,
      .widths = absl::GetFlag(FLAGS_widths),
      .warmup_steps = absl::GetFlag(FLAGS_warmup_steps)};
  for (size_t c = 0; c < blas_threads.size(); ++c) {
    ClusterOptions options{
        .coordinator_binary =
            BinaryPath(absl::GetFlag(FLAGS_coordinator_binary), argv0,
                       "server/coordinator/muonps-coordinator"),
        .worker_binary = BinaryPath(absl::GetFlag(FLAGS_worker_binary), argv0,
                                    "server/worker/muonps-worker"),
        .job = absl::StrCat("step-cpu-", getpid(), "-", c),
        .workers = absl::GetFlag(FLAGS_workers),
        .worker_openblas_threads = blas_threads[c],
        .keep_logs = absl::GetFlag(FLAGS_keep_logs)};
    MUONPS_ASSIGN_OR_RETURN(const InterleavedRun run,
                            RunInterleaved(matrices, options, cleanup));
    if (run.foreign_cpu_fraction > kBusyHostFraction) {
      std::fprintf(stderr,
                   "step_cpu: other processes used %.0f%% of the machine "
                   "during the run: its timings are not trustworthy\n",
                   100 * run.foreign_cpu_fraction);
    }
    std::printf("%s\n", StepCpuLine(run, context).dump().c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace bench
}  // namespace muonps

int main(int argc, char** argv) {
  // Signals go to one thread that cleans up the children; block them before
  // any other thread (gRPC's, OpenBLAS's) exists so they inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&signals, s);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::ParseCommandLine(argc, argv);

  muonps::bench::ChildCleanup cleanup(
      absl::StrCat("muonps-step-cpu-", getpid(), "-"));
  std::atomic<bool> done{false};
  std::thread interrupt([&] {
    const timespec poll{0, 100 * 1000 * 1000};
    while (!done.load()) {
      const int s = sigtimedwait(&signals, nullptr, &poll);
      if (s > 0) {
        std::fprintf(stderr, "step_cpu: signal %d, stopping the processes\n",
                     s);
        cleanup.KillAll();
        _exit(128 + s);
      }
    }
  });
  const absl::Status status = muonps::bench::Run(argv[0], &cleanup);
  done.store(true);
  interrupt.join();
  if (!status.ok()) {
    std::fprintf(stderr, "step_cpu: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
