// A muonps cluster on this host for benchmarks: one muonps-coordinator and
// N muonps-worker processes (the real binaries), each logging to a file in
// a scratch folder that also holds the workers' Unix sockets (short paths:
// the 108-byte sun_path limit).
//
// Start returns once the coordinator listens and every worker serves its
// socket. Stop ends the processes with SIGTERM (SIGKILL after a grace
// period) and removes the scratch folder unless told to keep it; the
// destructor of a cluster not stopped (a failed run) SIGKILLs whatever
// still runs and keeps the folder for its logs. Every child pid and the scratch
// folder are also registered with a ChildCleanup, so a signal handler
// thread can kill them when the bench is interrupted. Not thread-safe; not
// copyable.
#ifndef MUONPS_BENCH_STEP_CPU_LOOPBACK_CLUSTER_H_
#define MUONPS_BENCH_STEP_CPU_LOOPBACK_CLUSTER_H_

#include <sys/types.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "tests/harness/child_process.h"

namespace muonps {
namespace bench {

// What an interrupted bench must not leave behind: child processes, scratch
// folders, and /dev/shm segments whose names start with a prefix.
// Thread-safe.
class ChildCleanup {
 public:
  explicit ChildCleanup(std::string shm_prefix)
      : shm_prefix_(std::move(shm_prefix)) {}
  ChildCleanup(const ChildCleanup&) = delete;
  ChildCleanup& operator=(const ChildCleanup&) = delete;

  void AddProcess(pid_t pid);
  void RemoveProcess(pid_t pid);
  void AddFolder(const std::string& path);
  void RemoveFolder(const std::string& path);

  // SIGKILLs every registered process, removes every registered folder and
  // the matching shared-memory segments. For the interrupt path only.
  void KillAll();

 private:
  const std::string shm_prefix_;
  absl::Mutex mu_;
  std::set<pid_t> pids_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> folders_ ABSL_GUARDED_BY(mu_);
};

struct ClusterOptions {
  std::string coordinator_binary;
  std::string worker_binary;
  std::string job;
  int workers = 2;
  // Set OPENBLAS_NUM_THREADS to this in each worker's environment; 0
  // removes the variable (OpenBLAS's default: every core).
  int worker_openblas_threads = 1;
  // Long enough that a worker starved of CPU by Newton-Schulz never loses
  // its lease mid-run (a re-plan would reset momentum and skew timings).
  int64_t lease_ttl_ms = 30000;
  int64_t heartbeat_interval_ms = 1000;
  bool keep_logs = false;
};

class LoopbackCluster {
 public:
  // Starts the processes; the error names the process and carries its log
  // tail. `cleanup` must outlive the cluster.
  static absl::StatusOr<std::unique_ptr<LoopbackCluster>> Start(
      const ClusterOptions& options, ChildCleanup* cleanup);

  LoopbackCluster(const LoopbackCluster&) = delete;
  LoopbackCluster& operator=(const LoopbackCluster&) = delete;
  ~LoopbackCluster();

  const std::string& coordinator_address() const { return coordinator_; }
  const std::string& worker_socket(int i) const { return sockets_[i]; }
  const std::string& worker_id(int i) const { return worker_ids_[i]; }
  const std::string& folder() const { return folder_; }
  // The coordinator's and the workers' pids.
  std::vector<pid_t> pids() const;

  // SIGTERM to the workers, then the coordinator; waits for each (SIGKILL
  // after 10 s). INTERNAL naming the process if one exits uncleanly; the
  // folder is removed either way unless keep_logs.
  absl::Status Stop();

 private:
  LoopbackCluster(ClusterOptions options, ChildCleanup* cleanup,
                  std::string folder)
      : options_(std::move(options)),
        cleanup_(cleanup),
        folder_(std::move(folder)) {}
  absl::StatusOr<std::unique_ptr<testing::ChildProcess>> Launch(
      const std::vector<std::string>& argv, const std::string& log_name);
  void RemoveFolder();

  const ClusterOptions options_;
  ChildCleanup* const cleanup_;
  const std::string folder_;
  std::string coordinator_;
  std::vector<std::string> sockets_;
  std::vector<std::string> worker_ids_;
  std::unique_ptr<testing::ChildProcess> coordinator_process_;
  std::vector<std::unique_ptr<testing::ChildProcess>> worker_processes_;
  bool stopped_ = false;
};

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_CPU_LOOPBACK_CLUSTER_H_
