// The exporting side of the cuda_ipc GPU tests (the trainer's): Child,
// this binary run again as the importing process (the worker's:
// cuda_ipc_gpu_test_child.h says why and how), and the fixture CudaIpcTest,
// which skips without a GPU that supports CUDA IPC. Test-only;
// thread-compatible.
#ifndef MUONPS_LENDING_CUDA_IPC_GPU_TEST_FIXTURE_H_
#define MUONPS_LENDING_CUDA_IPC_GPU_TEST_FIXTURE_H_

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lending/cuda_ipc_gpu_test_child.h"

extern char** environ;

namespace muonps {
namespace ipc_test {

constexpr uint64_t kAllocationBytes = uint64_t{1} << 20;
constexpr uint64_t kLentOffset = uint64_t{256} << 10;
constexpr uint64_t kLentBytes = uint64_t{256} << 10;
const absl::Duration kChildTimeout = absl::Seconds(60);

#define ASSERT_CUDA(expr)                                        \
  do {                                                           \
    const absl::Status cuda_status_ = CudaStatus((expr), #expr); \
    ASSERT_TRUE(cuda_status_.ok()) << cuda_status_;              \
  } while (0)
#define ASSERT_OK(expr)                   \
  do {                                    \
    const absl::Status status_ = (expr);  \
    ASSERT_TRUE(status_.ok()) << status_; \
  } while (0)

// This binary, run as `--ipc_child=MODE ARGS...` with pipes on its stdin
// and stdout. Destruction kills and reaps it if it still runs.
class Child {
 public:
  static absl::StatusOr<std::unique_ptr<Child>> Start(
      const std::string& mode, const std::vector<std::string>& args) {
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return absl::InternalError("readlink(/proc/self/exe)");
    exe[n] = '\0';
    int to[2], from[2];
    if (pipe2(to, O_CLOEXEC) != 0) return absl::InternalError("pipe2");
    if (pipe2(from, O_CLOEXEC) != 0) {
      close(to[0]);
      close(to[1]);
      return absl::InternalError("pipe2");
    }
    std::vector<std::string> words = {exe, absl::StrCat(kChildFlag, mode)};
    words.insert(words.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, to[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, from[1], STDOUT_FILENO);
    pid_t pid = -1;
    const int rc =
        posix_spawn(&pid, exe, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(to[0]);
    close(from[1]);
    if (rc != 0) {
      close(to[1]);
      close(from[0]);
      return absl::InternalError(absl::StrCat("posix_spawn: ", strerror(rc)));
    }
    return std::unique_ptr<Child>(new Child(pid, to[1], from[0]));
  }

  ~Child() {
    close(to_child_);
    close(from_child_);
    if (!reaped_) {
      kill(pid_, SIGKILL);
      int status = 0;
      while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
    }
  }

  absl::Status WriteLine(const std::string& line) {
    const std::string text = line + "\n";
    if (write(to_child_, text.data(), text.size()) !=
        static_cast<ssize_t>(text.size())) {
      return absl::InternalError(
          absl::StrCat("write to child: ", strerror(errno)));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadLine(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const size_t end = pending_.find('\n');
      if (end != std::string::npos) {
        std::string line = pending_.substr(0, end);
        pending_.erase(0, end + 1);
        return line;
      }
      const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
      if (ms <= 0) return absl::DeadlineExceededError("no line from the child");
      pollfd ready = {from_child_, POLLIN, 0};
      if (poll(&ready, 1, static_cast<int>(ms)) <= 0) continue;
      char buffer[256];
      const ssize_t got = read(from_child_, buffer, sizeof(buffer));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        return absl::FailedPreconditionError(
            "the child closed its stdout (exited: see its stderr above)");
      }
      pending_.append(buffer, static_cast<size_t>(got));
    }
  }

  // The child's exit code, 128 + signal if a signal ended it. Kills it and
  // answers DEADLINE_EXCEEDED if it runs past `timeout`.
  absl::StatusOr<int> Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    int status = 0;
    while (!reaped_) {
      const pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        reaped_ = true;
      } else if (r < 0 && errno != EINTR) {
        return absl::InternalError(absl::StrCat("waitpid: ", strerror(errno)));
      } else if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("the child did not exit in time");
      } else {
        absl::SleepFor(absl::Milliseconds(10));
      }
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  Child(pid_t pid, int to_child, int from_child)
      : pid_(pid), to_child_(to_child), from_child_(from_child) {}
  pid_t pid_;
  int to_child_;
  int from_child_;
  bool reaped_ = false;
  std::string pending_;
};

class CudaIpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      (void)cudaGetLastError();
      GTEST_SKIP() << "no CUDA device: "
                   << (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    ASSERT_CUDA(cudaSetDevice(0));
    int ipc = 0;
    ASSERT_CUDA(cudaDeviceGetAttribute(&ipc, cudaDevAttrIpcEventSupport, 0));
    if (ipc == 0) GTEST_SKIP() << "device 0 does not support CUDA IPC";
  }

  // cudaMallocs `bytes` into `buffer` and fills them with Pattern.
  void AllocatePatterned(DeviceBuffer& buffer,
                         uint64_t bytes = kAllocationBytes) {
    ASSERT_CUDA(cudaMalloc(&buffer.ptr, bytes));
    ASSERT_OK(Fill(buffer.ptr, 0, bytes / 4, Pattern));
  }
};

}  // namespace ipc_test
}  // namespace muonps

#endif  // MUONPS_LENDING_CUDA_IPC_GPU_TEST_FIXTURE_H_
