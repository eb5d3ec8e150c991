// DataPlaneFixture's failure and recovery helpers: trainer loops that retry
// until answered, a worker restarted in place, a worker stopped at a step
// point.
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/grpc_status.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace testing {

std::vector<LoopOutcome> DataPlaneFixture::RunTrainerLoops(int64_t first,
                                                           int64_t last,
                                                           int attempts) {
  std::vector<LoopOutcome> out(trainers());
  std::vector<std::thread> threads;
  for (int r = 0; r < trainers(); ++r) {
    threads.emplace_back([this, r, first, last, attempts, &out] {
      for (int64_t step = first; step <= last; ++step) {
        WriteGradients(r, step);
        bool answered = false;
        for (int attempt = 0; attempt < attempts && !answered; ++attempt) {
          const absl::Time start = absl::Now();
          absl::StatusOr<StepResult> result = clients_[r]->Step(step);
          answered = result.ok();
          out[r].attempts.push_back({std::move(result), absl::Now() - start});
        }
        if (!answered) return;
      }
      out[r].finished = true;
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

int64_t LoopProgress::Slowest() const {
  int64_t slowest = done_[0].load();
  for (const auto& d : done_) slowest = std::min(slowest, d.load());
  return slowest;
}

int64_t LoopProgress::Fastest() const {
  int64_t fastest = done_[0].load();
  for (const auto& d : done_) fastest = std::max(fastest, d.load());
  return fastest;
}

int64_t LoopProgress::EndAfter(int64_t steps) {
  // A trainer starts a step only while it is at most the end, and no step
  // completes without every trainer: none is past Fastest() + 1 now.
  const int64_t last = Fastest() + 1 + steps;
  end_.store(last);
  return last;
}

bool LoopProgress::WaitFor(int64_t step, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (Slowest() < step) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

std::vector<RetryingLoop> DataPlaneFixture::RunRetryingLoops(
    int64_t first, int64_t last, LoopProgress* progress,
    absl::Duration per_step,
    std::function<void(int rank, int64_t step)> after_step) {
  std::vector<RetryingLoop> out(trainers());
  std::vector<std::thread> threads;
  for (int r = 0; r < trainers(); ++r) {
    threads.emplace_back([this, r, first, last, progress, per_step, &after_step,
                          &out] {
      RetryingLoop& loop = out[r];
      for (int64_t step = first; step <= last; ++step) {
        if (progress != nullptr && step > progress->end()) break;
        if (clients_[r] == nullptr) {
          // Its restart failed (after_step reports why): no trainer is left
          // to step.
          loop.last_failure = "the trainer's restart failed";
          return;
        }
        WriteGradients(r, step);
        const absl::Time give_up = absl::Now() + per_step;
        bool answered = false;
        while (!answered && absl::Now() < give_up) {
          absl::StatusOr<StepResult> result = clients_[r]->Step(step);
          answered = result.ok();
          if (answered) {
            loop.resets += result->momentum_reset;
            continue;
          }
          const absl::StatusCode code = result.status().code();
          if (loop.failures[code]++ == 0) {
            loop.first[code] = std::string(result.status().message());
          }
          loop.last_failure = result.status().ToString();
          loop.attempts.push_back(absl::StrCat("step ", step, " at ",
                                               absl::FormatTime(absl::Now()),
                                               ": ", loop.last_failure));
          absl::SleepFor(absl::Milliseconds(50));
        }
        if (!answered) return;
        loop.last_done = step;
        if (after_step) after_step(r, step);
        if (progress != nullptr) progress->Finished(r, step);
      }
      loop.finished = true;
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

void DataPlaneFixture::RestartWorker(int worker) {
  ClusterOptions plain = options_;
  plain.worker_flags.clear();
  WorkerProcess& w = workers_.at(worker);
  const std::string old_log = w.process ? w.process->Log() : "";
  w.process.reset();
  ASSERT_NO_FATAL_FAILURE(StartWorker(worker, plain));
  absl::StatusOr<std::string> up =
      w.process->WaitForLog("listening on unix:", absl::Seconds(30));
  ASSERT_TRUE(up.ok()) << up.status() << "\n(before the restart)\n" << old_log;
}

void DataPlaneFixture::JoinDedicatedWorker() {
  const int index = workers();
  ClusterOptions dedicated = options_;
  dedicated.worker_flags[index] = {"--dedicated"};
  workers_.emplace_back();
  ASSERT_NO_FATAL_FAILURE(StartWorker(index, dedicated));
  absl::StatusOr<std::string> up = workers_[index].process->WaitForLog(
      "listening on unix:", absl::Seconds(30));
  ASSERT_TRUE(up.ok()) << up.status();
}

std::unique_ptr<ChildProcess> DataPlaneFixture::StartStandbyWorker(
    const std::string& id) {
  absl::StatusOr<std::unique_ptr<ChildProcess>> started = ChildProcess::Start(
      WorkerArgv(id, absl::StrCat(socket_dir_, "/", id, ".sock"), -1, options_),
      absl::StrCat(log_dir_, "/", id, ".log"));
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return nullptr;
  absl::StatusOr<std::string> up =
      (*started)->WaitForLog("listening on unix:", absl::Seconds(30));
  EXPECT_TRUE(up.ok()) << up.status();
  return *std::move(started);
}

absl::StatusOr<int> DataPlaneFixture::WaitForWorkerExit(
    int worker, absl::Duration timeout) {
  return workers_.at(worker).process->Wait(timeout);
}

absl::Status DataPlaneFixture::WaitUntilStopped(int worker,
                                                absl::Duration timeout) {
  const pid_t pid = workers_.at(worker).process->pid();
  const absl::Time deadline = absl::Now() + timeout;
  std::string stat;
  while (absl::Now() < deadline) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
    std::getline(in, stat);
    // "pid (comm) S ...": the state follows the last ')'.
    const size_t close = stat.rfind(')');
    if (close != std::string::npos && close + 2 < stat.size() &&
        stat[close + 2] == 'T') {
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "worker ", worker, " (pid ", pid, ") did not stop; /proc stat: ", stat));
}

}  // namespace testing
}  // namespace muonps
