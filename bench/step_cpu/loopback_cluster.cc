#include "bench/step_cpu/loopback_cluster.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/secret.h"
#include "common/status.h"

namespace muonps {
namespace bench {
namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(30);
constexpr absl::Duration kStopGrace = absl::Seconds(10);

// Waits for a SIGTERMed child; SIGKILLs it after the grace period. OK if it
// exited with status 0.
absl::Status StopChild(testing::ChildProcess* child, const std::string& what) {
  child->Signal(SIGTERM);
  absl::StatusOr<int> status = child->Wait(kStopGrace);
  if (!status.ok()) {
    child->Signal(SIGKILL);
    (void)child->Wait(kStopGrace);
    return absl::InternalError(absl::StrCat(what, " ignored SIGTERM for ",
                                            absl::FormatDuration(kStopGrace)));
  }
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(absl::StrCat(what, " ended with wait status ",
                                            *status, "; log ",
                                            child->log_path()));
  }
  return absl::OkStatus();
}

}  // namespace

void ChildCleanup::AddProcess(pid_t pid) {
  absl::MutexLock lock(&mu_);
  pids_.insert(pid);
}

void ChildCleanup::RemoveProcess(pid_t pid) {
  absl::MutexLock lock(&mu_);
  pids_.erase(pid);
}

void ChildCleanup::AddFolder(const std::string& path) {
  absl::MutexLock lock(&mu_);
  folders_.insert(path);
}

void ChildCleanup::RemoveFolder(const std::string& path) {
  absl::MutexLock lock(&mu_);
  folders_.erase(path);
}

void ChildCleanup::KillAll() {
  absl::MutexLock lock(&mu_);
  for (pid_t pid : pids_) kill(pid, SIGKILL);
  for (pid_t pid : pids_) waitpid(pid, nullptr, 0);
  pids_.clear();
  std::error_code ignored;
  for (const std::string& folder : folders_) {
    std::filesystem::remove_all(folder, ignored);
  }
  folders_.clear();
  // The trainers' segments: their owners (the Clients) never ran their
  // destructors on this path.
  for (const auto& entry :
       std::filesystem::directory_iterator("/dev/shm", ignored)) {
    if (absl::StartsWith(entry.path().filename().string(), shm_prefix_)) {
      std::filesystem::remove(entry.path(), ignored);
    }
  }
}

absl::StatusOr<std::unique_ptr<LoopbackCluster>> LoopbackCluster::Start(
    const ClusterOptions& options, ChildCleanup* cleanup) {
  if (options.workers < 1) {
    return InvalidField("workers", absl::StrCat(options.workers, " < 1"));
  }
  for (const std::string& binary :
       {options.coordinator_binary, options.worker_binary}) {
    if (!std::filesystem::exists(binary)) {
      return FieldError(absl::StatusCode::kNotFound, "binary",
                        absl::StrCat(Quoted(binary),
                                     " does not exist (bazel build it, or "
                                     "pass --coordinator_binary and "
                                     "--worker_binary)"));
    }
  }
  // Directly under /tmp, whatever TMPDIR says: socket paths must stay
  // short.
  std::string folder = "/tmp/muonps-step-cpu-XXXXXX";
  if (mkdtemp(folder.data()) == nullptr) {
    return absl::InternalError("cannot create a folder under /tmp");
  }
  cleanup->AddFolder(folder);
  std::unique_ptr<LoopbackCluster> cluster(
      new LoopbackCluster(options, cleanup, folder));

  // A fresh bearer token, as a private service has: the coordinator and
  // the workers check it; the workers, trainers and this process send it
  // (MUONPS_TOKEN_FILE, inherited by the children).
  const std::string token_file = folder + "/token";
  {
    const mode_t old_umask = umask(077);
    std::ofstream(token_file) << RandomHex(32) << "\n";
    umask(old_umask);
  }
  setenv("MUONPS_TOKEN_FILE", token_file.c_str(), 1);
  MUONPS_ASSIGN_OR_RETURN(
      cluster->coordinator_process_,
      cluster->Launch({options.coordinator_binary, "--host=127.0.0.1",
                       "--port=0", "--metrics_port=-1", "--insecure",
                       absl::StrCat("--lease_ttl_ms=", options.lease_ttl_ms),
                       absl::StrCat("--heartbeat_interval_ms=",
                                    options.heartbeat_interval_ms)},
                      "coordinator.log"));
  MUONPS_ASSIGN_OR_RETURN(
      cluster->coordinator_,
      cluster->coordinator_process_->WaitForLog(
          R"(listening on ([0-9.]+:[0-9]+))", kStartTimeout));

  for (int i = 0; i < options.workers; ++i) {
    const std::string id = absl::StrCat("w", i);
    const std::string socket = absl::StrCat(folder, "/", id, ".sock");
    // env(1) sets or clears OpenBLAS's thread count, then execs the worker
    // in place (same pid).
    std::vector<std::string> argv = {"/usr/bin/env"};
    if (options.worker_openblas_threads > 0) {
      argv.push_back(absl::StrCat("OPENBLAS_NUM_THREADS=",
                                  options.worker_openblas_threads));
    } else {
      argv.insert(argv.end(), {"-u", "OPENBLAS_NUM_THREADS"});
    }
    argv.insert(
        argv.end(),
        {options.worker_binary,
         absl::StrCat("--coordinator=", cluster->coordinator_),
         absl::StrCat("--job=", options.job), absl::StrCat("--worker_id=", id),
         absl::StrCat("--socket=", socket), "--metrics_port=-1"});
    MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<testing::ChildProcess> worker,
                            cluster->Launch(argv, absl::StrCat(id, ".log")));
    cluster->worker_processes_.push_back(std::move(worker));
    cluster->sockets_.push_back(socket);
    cluster->worker_ids_.push_back(id);
  }
  for (int i = 0; i < options.workers; ++i) {
    MUONPS_RETURN_IF_ERROR(
        cluster->worker_processes_[i]
            ->WaitForLog(R"(listening on unix:(\S+))", kStartTimeout)
            .status());
  }
  return cluster;
}

absl::StatusOr<std::unique_ptr<testing::ChildProcess>> LoopbackCluster::Launch(
    const std::vector<std::string>& argv, const std::string& log_name) {
  MUONPS_ASSIGN_OR_RETURN(
      std::unique_ptr<testing::ChildProcess> child,
      testing::ChildProcess::Start(argv, absl::StrCat(folder_, "/", log_name)));
  cleanup_->AddProcess(child->pid());
  return child;
}

std::vector<pid_t> LoopbackCluster::pids() const {
  std::vector<pid_t> pids;
  if (coordinator_process_ != nullptr) {
    pids.push_back(coordinator_process_->pid());
  }
  for (const auto& worker : worker_processes_) pids.push_back(worker->pid());
  return pids;
}

absl::Status LoopbackCluster::Stop() {
  absl::Status status;
  for (size_t i = 0; i < worker_processes_.size(); ++i) {
    status.Update(StopChild(worker_processes_[i].get(),
                            absl::StrCat("worker ", worker_ids_[i])));
    cleanup_->RemoveProcess(worker_processes_[i]->pid());
  }
  if (coordinator_process_ != nullptr) {
    status.Update(StopChild(coordinator_process_.get(), "coordinator"));
    cleanup_->RemoveProcess(coordinator_process_->pid());
  }
  stopped_ = true;
  RemoveFolder();
  return status;
}

void LoopbackCluster::RemoveFolder() {
  if (!options_.keep_logs) {
    std::error_code ignored;
    std::filesystem::remove_all(folder_, ignored);
  }
  cleanup_->RemoveFolder(folder_);
}

LoopbackCluster::~LoopbackCluster() {
  if (stopped_) return;
  // ChildProcess's destructor SIGKILLs and reaps.
  for (auto& worker : worker_processes_) {
    cleanup_->RemoveProcess(worker->pid());
    worker.reset();
  }
  if (coordinator_process_ != nullptr) {
    cleanup_->RemoveProcess(coordinator_process_->pid());
    coordinator_process_.reset();
  }
  // Not stopped: a failed run, whose logs say why.
  cleanup_->RemoveFolder(folder_);
}

}  // namespace bench
}  // namespace muonps
