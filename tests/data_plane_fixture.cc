// DataPlaneFixture's processes: StartJob, starting, restarting, killing and
// signalling the coordinator and the workers, and their teardown. The
// fixture's other parts: trainer ranks in data_plane_trainers.cc, plans,
// status and checks in data_plane_checks.cc, failure and recovery helpers
// in data_plane_recovery.cc; the models and data in data_plane_model.cc and
// the reference in data_plane_reference.cc.
#include "tests/data_plane_fixture.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace muonps {
namespace testing {
namespace {

constexpr absl::Duration kStartTimeout = absl::Seconds(30);

}  // namespace

DataPlaneFixture::~DataPlaneFixture() {
  // Clients first: their segments are unlinked while the workers, which
  // only map them, may still run.
  clients_.clear();
  for (WorkerProcess& w : workers_) w.process.reset();  // SIGKILL, reap
  coordinator_.reset();
  std::error_code ignored;
  if (!log_dir_.empty()) std::filesystem::remove_all(log_dir_, ignored);
  if (!socket_dir_.empty()) std::filesystem::remove_all(socket_dir_, ignored);
}

void DataPlaneFixture::TearDown() {
  if (!HasFailure()) return;
  if (coordinator_) std::cerr << "== coordinator log\n" << coordinator_->Log();
  for (const WorkerProcess& w : workers_) {
    if (w.process) std::cerr << "== " << w.id << " log\n" << w.process->Log();
  }
}

void DataPlaneFixture::StartCoordinator(const ClusterOptions& options) {
  // Restarts (RestartCoordinator) listen on the same port: one no other
  // process's connections take meanwhile.
  const absl::StatusOr<int> port = PortBelowEphemeralRange(options.host);
  ASSERT_TRUE(port.ok()) << port.status();
  coordinator_argv_ = {
      RunfilePath("server/coordinator/muonps-coordinator"),
      absl::StrCat("--port=", *port),
      "--metrics_port=-1",
      "--host=" + options.host,
      absl::StrCat("--lease_ttl_ms=", options.lease_ttl_ms),
      absl::StrCat("--heartbeat_interval_ms=", options.heartbeat_interval_ms)};
  if (!options.state_dir.empty()) {
    coordinator_argv_.push_back("--state_dir=" + options.state_dir);
  }
  if (options.network_gbs > 0) {
    coordinator_argv_.push_back(
        absl::StrCat("--network_gbs=", options.network_gbs));
  }
  if (options.network_hop_us >= 0) {
    coordinator_argv_.push_back(
        absl::StrCat("--network_hop_us=", options.network_hop_us));
  }
  for (std::string& flag : SecuredCoordinatorFlags()) {
    coordinator_argv_.push_back(std::move(flag));
  }
  ASSERT_NO_FATAL_FAILURE(RestartCoordinator());
  coordinator_stub_ =
      v1::Coordinator::NewStub(TestChannel(coordinator_address_));
}

void DataPlaneFixture::RestartCoordinator() {
  if (!coordinator_address_.empty()) {  // the same port again
    coordinator_argv_[1] = absl::StrCat(
        "--port=",
        coordinator_address_.substr(coordinator_address_.rfind(':') + 1));
  }
  const std::string log = coordinator_starts_ == 0
                              ? log_dir_ + "/coordinator.log"
                              : absl::StrCat(log_dir_, "/coordinator.",
                                             coordinator_starts_, ".log");
  ++coordinator_starts_;
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(coordinator_argv_, log);
  ASSERT_TRUE(started.ok()) << started.status();
  coordinator_ = *std::move(started);
  const std::string host = options_.host;
  absl::StatusOr<std::string> port = coordinator_->WaitForLog(
      absl::StrCat("listening on ", absl::StrReplaceAll(host, {{".", "\\."}}),
                   ":(\\d+)"),
      kStartTimeout);
  ASSERT_TRUE(port.ok()) << port.status();
  // Written at the first start only (later ones listen on the same port),
  // so trainers that start meanwhile may read it.
  const std::string address = absl::StrCat(host, ":", *port);
  if (address != coordinator_address_) coordinator_address_ = address;
}

void DataPlaneFixture::KillCoordinator() {
  coordinator_->Signal(SIGKILL);
  const absl::StatusOr<int> waited = coordinator_->Wait(absl::Seconds(10));
  ASSERT_TRUE(waited.ok()) << waited.status();
}

std::vector<std::string> DataPlaneFixture::WorkerArgv(
    const std::string& id, const std::string& socket, int index,
    const ClusterOptions& options) const {
  std::vector<std::string> argv = {
      RunfilePath("server/worker/muonps-worker"),
      "--coordinator=" + coordinator_address_,
      absl::StrCat("--job=", job_),
      "--worker_id=" + id,
      "--socket=" + socket,
      "--metrics_port=-1",
      "--device=cpu",
      absl::StrCat("--io_timeout_ms=", options.io_timeout_ms)};
  auto host = options.worker_host.find(index);
  argv.push_back("--host=" + (host != options.worker_host.end()
                                  ? host->second
                                  : options.host));
  auto node = options.worker_node.find(index);
  if (node != options.worker_node.end()) {
    argv.push_back("--node=" + node->second);
  }
  auto extra = options.worker_flags.find(index);
  if (extra != options.worker_flags.end()) {
    argv.insert(argv.end(), extra->second.begin(), extra->second.end());
  }
  auto wrapper = options.worker_wrapper.find(index);
  if (wrapper != options.worker_wrapper.end()) {
    argv.insert(argv.begin(), wrapper->second.begin(), wrapper->second.end());
  }
  return argv;
}

void DataPlaneFixture::StartWorker(int index, const ClusterOptions& options) {
  WorkerProcess& w = workers_[index];
  w.id = absl::StrCat("w", index);
  w.socket = absl::StrCat(socket_dir_, "/", w.id, ".sock");
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(WorkerArgv(w.id, w.socket, index, options),
                          absl::StrCat(log_dir_, "/", w.id, ".log"));
  ASSERT_TRUE(started.ok()) << started.status();
  w.process = *std::move(started);
  w.stub = v1::Worker::NewStub(TestChannel("unix:" + w.socket));
}

void DataPlaneFixture::StartJob(const ModelDecl& model,
                                const ClusterOptions& options,
                                absl::Status* start_status) {
  model_ = model;
  options_ = options;
  // Unique, since the tests' sandboxes share /dev/shm and a worker removes
  // the segments of its own job's trainers that look dead from its PID
  // namespace.
  job_ = absl::StrCat("data-plane-", getpid(), "-", std::random_device()());
  log_dir_ = NewTempDir("data_plane");
  ASSERT_FALSE(log_dir_.empty());
  // Unix socket paths hold at most 108 bytes, too few for TEST_TMPDIR.
  std::string socket_dir = "/tmp/muonps-dp-XXXXXX";
  ASSERT_NE(mkdtemp(socket_dir.data()), nullptr);
  socket_dir_ = socket_dir;
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(options));
  workers_.resize(options.workers);
  for (int i = 0; i < options.workers; ++i) {
    ASSERT_NO_FATAL_FAILURE(StartWorker(i, options));
  }
  for (WorkerProcess& w : workers_) {
    absl::StatusOr<std::string> up =
        w.process->WaitForLog("listening on unix:", kStartTimeout);
    ASSERT_TRUE(up.ok()) << up.status();
  }
  ASSERT_NO_FATAL_FAILURE(StartTrainers(start_status));
  if (start_status != nullptr && !start_status->ok()) return;
  const absl::Status planned = WaitForFullPlan(kStartTimeout);
  ASSERT_TRUE(planned.ok()) << planned;
}

void DataPlaneFixture::KillWorker(int worker) {
  ChildProcess& p = *workers_.at(worker).process;
  p.Signal(SIGKILL);
  const absl::StatusOr<int> waited = p.Wait(absl::Seconds(10));
  ASSERT_TRUE(waited.ok()) << waited.status();
}

void DataPlaneFixture::SignalWorker(int worker, int signal) {
  ASSERT_TRUE(workers_.at(worker).process->running());
  workers_[worker].process->Signal(signal);
}

}  // namespace testing
}  // namespace muonps
