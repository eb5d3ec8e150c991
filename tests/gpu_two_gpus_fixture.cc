#include "tests/gpu_two_gpus_fixture.h"

#include <cuda_runtime.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "tests/gpu_test_support.h"

namespace muonps {
namespace testing {
namespace {

constexpr absl::Duration kStartTimeout = kGpuStartTimeout;

}  // namespace

int64_t UnixMs() { return absl::ToUnixMillis(absl::Now()); }

// Waits until `pid` is stopped (SIGSTOP; /proc state T).
absl::Status WaitUntilStopped(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string stat;
  while (absl::Now() < deadline) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::getline(in, stat);
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() &&
        stat[close + 2] == 'T') {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("process ", pid, " did not stop within ",
                   absl::FormatDuration(timeout), "; /proc stat: ", stat));
}

// Waits for `child` to exit, OK only with exit status 0.
absl::Status WaitForSuccess(ChildProcess& child, absl::Duration timeout) {
  absl::StatusOr<int> status = child.Wait(timeout);
  if (!status.ok()) return status.status();
  if (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      child.log_path(), ": pid ", child.pid(), " ended with wait status ",
      *status, WIFSIGNALED(*status) ? " (signal)" : ""));
}

// The answer trainer `child` logged to attempt `attempt` of step `step`.
absl::StatusOr<StepAttempt> WaitForAttempt(ChildProcess& child, int64_t step,
                                           int attempt,
                                           absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    // Read before checking that the child runs: its last lines count.
    const bool running = child.running();
    for (const StepAttempt& a : ParseAttempts(child.Log())) {
      if (a.step == step && a.attempt == attempt) return a;
    }
    if (!running) {
      return absl::FailedPreconditionError(
          absl::StrCat(child.log_path(), ": the trainer exited before ",
                       "answering attempt ", attempt, " of step ", step));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          child.log_path(), ": no answer to attempt ", attempt, " of step ",
          step, " within ", absl::FormatDuration(timeout), " (a hang)"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

// The plan versions for which `worker`'s log says it joined a communicator
// as NCCL rank `rank` of `size` (nccl_bootstrap.cc's line).
std::vector<int64_t> NcclPlanVersions(const std::string& log,
                                      const std::string& worker, int rank,
                                      int size) {
  const std::regex re(absl::StrCat("worker=", worker,
                                   R"( plan_version=(\d+) NCCL rank )", rank,
                                   " of ", size, " on cuda:"));
  std::vector<int64_t> out;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re);
       it != std::sregex_iterator(); ++it) {
    int64_t v = 0;
    if (absl::SimpleAtoi((*it)[1].str(), &v)) out.push_back(v);
  }
  return out;
}

bool AllFinite(const std::vector<std::vector<float>>& params) {
  for (const std::vector<float>& p : params) {
    for (float v : p) {
      if (!std::isfinite(v)) return false;
    }
  }
  return true;
}

void TwoGpusTest::SetUp() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (count == 0) GTEST_SKIP() << "needs a GPU";
  if (count == 1) {
    std::cerr << "one GPU: both workers and trainers on cuda:0, each worker "
                 "a NCCL host of its own (NCCL's network transport on "
                 "loopback)\n";
  }
  // NCCL's own warnings go to the worker logs; multicast stays off
  // (KINDS.md), also when this binary runs outside run_gpu_tests.sh.
  setenv("NCCL_DEBUG", "WARN", /*overwrite=*/0);
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  log_dir_ = NewTempDir("gpu_two_gpus");
  ASSERT_FALSE(log_dir_.empty());
  char socket_dir[] = "/tmp/muonps-2g-XXXXXX";  // short: sun_path
  ASSERT_NE(mkdtemp(socket_dir), nullptr);
  socket_dir_ = socket_dir;
  std::cerr << "logs of this case: " << log_dir_ << "\n";
}

void TwoGpusTest::TearDown() {
  const bool failed = HasFailure();
  trainers_.clear();  // SIGKILL and reap whatever still runs
  for (auto& w : workers_) w.reset();
  coordinator_.reset();
  if (failed) DumpLogs();
  std::error_code ignored;
  std::filesystem::remove_all(socket_dir_, ignored);
  if (!failed && !log_dir_.empty()) {
    std::filesystem::remove_all(log_dir_, ignored);
  }
}

void TwoGpusTest::DumpLogs() {
  std::vector<std::filesystem::path> logs;
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator(log_dir_, error)) {
    if (entry.path().extension() == ".log") logs.push_back(entry.path());
  }
  std::sort(logs.begin(), logs.end());
  for (const auto& path : logs) {
    std::ifstream in(path);
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    constexpr size_t kTail = 24000;
    std::cerr << "==== " << path.string() << " (" << text.size() << " bytes"
              << (text.size() > kTail ? ", tail" : "") << ")\n"
              << (text.size() > kTail ? text.substr(text.size() - kTail) : text)
              << "\n";
  }
  std::cerr << "(logs kept in " << log_dir_ << ")\n";
}

std::string TwoGpusTest::Socket(int w) const {
  return absl::StrCat(socket_dir_, "/w", w, ".sock");
}

void TwoGpusTest::StartCoordinator(int64_t lease_ms) {
  std::vector<std::string> argv = {
      BinaryPath("server/coordinator/muonps-coordinator"), "--port=0",
      "--metrics_port=-1", absl::StrCat("--lease_ttl_ms=", lease_ms),
      "--heartbeat_interval_ms=500"};
  for (std::string& flag : SecuredCoordinatorFlags()) {
    argv.push_back(std::move(flag));
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(argv, log_dir_ + "/coordinator.log");
  ASSERT_TRUE(started.ok()) << started.status();
  coordinator_ = *std::move(started);
  absl::StatusOr<std::string> port = coordinator_->WaitForLog(
      R"(listening on 127\.0\.0\.1:(\d+))", kStartTimeout);
  ASSERT_TRUE(port.ok()) << port.status();
  address_ = absl::StrCat("127.0.0.1:", *port);
}

void TwoGpusTest::StartWorker(int w,
                              const std::vector<std::string>& extra_flags,
                              const std::string& log_name) {
  std::vector<std::string> argv = {
      BinaryPath("server/worker/muonps-worker"),
      "--coordinator=" + address_,
      absl::StrCat("--job=", kTwoGpusJob),
      absl::StrCat("--worker_id=w", w),
      "--socket=" + Socket(w),
      "--metrics_port=-1",
      absl::StrCat("--device=cuda:", GpuOf(w)),
      "--gpu_transport=nccl",
      absl::StrCat("--io_timeout_ms=", kIoTimeoutMs)};
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  // Workers sharing a GPU: each a NCCL host of its own.
  std::vector<std::string> env;
  if (GpuOf(1) == GpuOf(0)) {
    env = OwnNcclHostEnvironment(absl::StrCat("gpu2x-w", w));
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(argv, absl::StrCat(log_dir_, "/", log_name), env);
  ASSERT_TRUE(started.ok()) << started.status();
  workers_[w] = *std::move(started);
  absl::StatusOr<std::string> up =
      workers_[w]->WaitForLog("listening on unix:", kStartTimeout);
  ASSERT_TRUE(up.ok()) << up.status();
}

std::unique_ptr<ChildProcess> TwoGpusTest::StartTrainer(
    int rank, int64_t first, int64_t last, const std::string& name) {
  TrainerConfig c;
  c.coordinator = address_;
  c.job = kTwoGpusJob;
  c.socket = Socket(rank);
  c.rank = rank;
  c.trainers = trainer_count();
  c.dedicated = dedicated_ ? 1 : 0;
  c.layout = layout_;
  c.dtype = dtype_;
  c.first_step = first;
  c.last_step = last;
  c.params_out = absl::StrCat(log_dir_, "/", name, ".params");
  c.retry_for = retry_for_;
  std::vector<std::string> argv = {"/proc/self/exe"};
  for (std::string& arg : TrainerArgs(c)) {
    argv.push_back(std::move(arg));
  }
  absl::StatusOr<std::unique_ptr<ChildProcess>> started =
      ChildProcess::Start(argv, absl::StrCat(log_dir_, "/", name, ".log"));
  EXPECT_TRUE(started.ok()) << started.status();
  return started.ok() ? *std::move(started) : nullptr;
}

void TwoGpusTest::StartJob(int64_t lease_ms,
                           const std::vector<std::string>& w0_flags,
                           const std::vector<std::string>& w1_flags,
                           int64_t last_step) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(lease_ms));
  ASSERT_NO_FATAL_FAILURE(StartWorker(0, w0_flags, "worker0.log"));
  trainers_.push_back(StartTrainer(0, 0, last_step, "trainer0"));
  ASSERT_NE(trainers_.back(), nullptr);
  absl::StatusOr<std::string> joined = workers_[0]->WaitForLog(
      R"(worker=w0 joined: plan_version=\d+)", kStartTimeout);
  ASSERT_TRUE(joined.ok()) << joined.status();
  std::vector<std::string> w1 = w1_flags;
  if (dedicated_) w1.push_back("--dedicated");
  ASSERT_NO_FATAL_FAILURE(StartWorker(1, w1, "worker1.log"));
  if (!dedicated_) {
    trainers_.push_back(StartTrainer(1, 0, last_step, "trainer1"));
    ASSERT_NE(trainers_.back(), nullptr);
  }
  absl::StatusOr<std::string> ranked = workers_[1]->WaitForLog(
      R"(worker=w1 plan_version=\d+ rank=1 )", kStartTimeout);
  ASSERT_TRUE(ranked.ok()) << ranked.status();
  for (int r = 0; r < trainer_count(); ++r) {
    absl::StatusOr<std::string> started = trainers_[r]->WaitForLog(
        absl::StrCat("trainer=", r, " started"), kStartTimeout);
    ASSERT_TRUE(started.ok()) << started.status();
  }
}

absl::StatusOr<v1::WorkerStatus> TwoGpusTest::WorkerStatus(int w) {
  std::unique_ptr<v1::Worker::Stub> stub =
      v1::Worker::NewStub(TestChannel("unix:" + Socket(w)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(5));
  v1::WorkerStatus out;
  const grpc::Status s = stub->GetStatus(&context, {}, &out);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("GetStatus of w", w, ": ", s.error_message()));
  }
  return out;
}

}  // namespace testing
}  // namespace muonps
