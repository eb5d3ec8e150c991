// GPU test of common/cuda_ipc: this process exports, as a trainer does, and
// a child process opens, as the worker does (the child is this binary run
// again: cuda_ipc_gpu_test_child.h says why and how). Needs one GPU; skips
// without one.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cuda_ipc.h"
#include "common/cuda_ipc_gpu_test_child.h"
#include "common/status.h"
#include "gtest/gtest.h"

extern char** environ;

namespace muonps {
namespace ipc_test {
namespace {

constexpr uint64_t kAllocationBytes = uint64_t{1} << 20;
constexpr uint64_t kLentOffset = uint64_t{256} << 10;
constexpr uint64_t kLentBytes = uint64_t{256} << 10;
const absl::Duration kChildTimeout = absl::Seconds(60);

#define ASSERT_CUDA(expr)                                  \
  do {                                                     \
    const absl::Status cuda_status_ = Cuda((expr), #expr); \
    ASSERT_TRUE(cuda_status_.ok()) << cuda_status_;        \
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

// Runs a child to its end and expects exit code 0.
void RunChildToSuccess(const std::string& mode,
                       const std::vector<std::string>& args) {
  absl::StatusOr<std::unique_ptr<Child>> child = Child::Start(mode, args);
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> code = (*child)->Wait(kChildTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(*code, 0) << "child " << mode << " failed: see its stderr above";
}

// A stream held behind a host function until Open(); destruction opens the
// gate and drains the stream before freeing what the host function reads.
class GatedStream {
 public:
  ~GatedStream() {
    if (stream_ == nullptr) return;
    Open();
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
  }
  absl::Status Start() {
    MUONPS_RETURN_IF_ERROR(
        Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
             "cudaStreamCreateWithFlags"));
    return Cuda(cudaLaunchHostFunc(stream_, &WaitForGate, &open_),
                "cudaLaunchHostFunc");
  }
  void Open() { open_.store(true); }
  cudaStream_t stream() const { return stream_; }

 private:
  static void CUDART_CB WaitForGate(void* open) {
    const auto give_up =
        std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (!static_cast<std::atomic<bool>*>(open)->load() &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  cudaStream_t stream_ = nullptr;
  std::atomic<bool> open_{false};
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

TEST_F(CudaIpcTest, ChildOpensSubBlockAtItsOffsetAndParentSeesItsWrites) {
  DeviceBuffer buffer;
  ASSERT_NO_FATAL_FAILURE(AllocatePatterned(buffer));
  absl::StatusOr<IpcMemoryRef> ref =
      ExportDeviceMemory(buffer.bytes() + kLentOffset, kLentBytes);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->handle.size(), kCudaIpcHandleBytes);
  EXPECT_EQ(ref->offset, kLentOffset) << "allocation base not found";
  EXPECT_EQ(ref->bytes, kLentBytes);
  EXPECT_EQ(ref->device, 0);

  ASSERT_NO_FATAL_FAILURE(RunChildToSuccess("read_write", RefArgs(*ref)));
  absl::StatusOr<std::vector<uint32_t>> after =
      ReadWords(buffer.ptr, kAllocationBytes / 4);
  ASSERT_TRUE(after.ok()) << after.status();
  const uint64_t first = kLentOffset / 4, end = (kLentOffset + kLentBytes) / 4;
  for (uint64_t i = 0; i < after->size(); ++i) {
    const uint32_t want = i >= first && i < end ? ChildPattern(i) : Pattern(i);
    ASSERT_EQ((*after)[i], want)
        << "word " << i << " (lent words [" << first << ", " << end << "))";
  }
}

TEST_F(CudaIpcTest,
       HostManagedMisalignedAndOutOfRangeExportsAreInvalidArgument) {
  auto expect_invalid = [](const void* ptr, uint64_t bytes, const char* what,
                           const std::string& says) {
    absl::StatusOr<IpcMemoryRef> ref = ExportDeviceMemory(ptr, bytes);
    EXPECT_EQ(ref.status().code(), absl::StatusCode::kInvalidArgument)
        << what << ": " << ref.status();
    EXPECT_NE(std::string(ref.status().message()).find(says), std::string::npos)
        << what << ": " << ref.status();
  };
  const std::string not_device = "is not device memory (cudaMalloc'd)";
  std::vector<uint32_t> pageable(1024);
  expect_invalid(pageable.data(), 4096, "malloc'd host memory", not_device);
  void* pinned = nullptr;
  ASSERT_CUDA(cudaMallocHost(&pinned, 4096));
  expect_invalid(pinned, 4096, "cudaMallocHost memory", not_device);
  ASSERT_CUDA(cudaFreeHost(pinned));
  int managed_ok = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&managed_ok, cudaDevAttrManagedMemory, 0));
  if (managed_ok != 0) {
    void* managed = nullptr;
    ASSERT_CUDA(cudaMallocManaged(&managed, 4096));
    expect_invalid(managed, 4096, "managed memory", not_device);
    ASSERT_CUDA(cudaFree(managed));
  }

  DeviceBuffer buffer;
  ASSERT_NO_FATAL_FAILURE(AllocatePatterned(buffer));
  // Past the end even if CUDA rounds the allocation up to 2 MiB.
  expect_invalid(buffer.bytes() + (768 << 10), uint64_t{2} << 20,
                 "range past the allocation's end", "past the end");
  expect_invalid(buffer.bytes() + 2, 4, "misaligned pointer", "aligned");
  expect_invalid(buffer.ptr, 0, "zero bytes", "bytes");
  expect_invalid(nullptr, 4, "null", "ptr");
  absl::StatusOr<IpcMemoryRef> tail =
      ExportDeviceMemory(buffer.bytes() + kAllocationBytes - 4096, 4096);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->offset, kAllocationBytes - 4096);

  IpcMemoryMap map;
  IpcMemoryRef bad = *tail;
  bad.device = 1 << 20;
  EXPECT_EQ(map.Open(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = *tail;
  bad.handle.resize(63);
  EXPECT_EQ(map.Open(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(map.open_mappings(), 0u);
  EXPECT_EQ(IpcEvent::Open(std::string(10, 'x'), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(IpcEvent::Create(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<IpcEvent> event = IpcEvent::Create(0);
  ASSERT_TRUE(event.ok()) << event.status();
  IpcEvent taken = std::move(*event);
  EXPECT_EQ(event->Record(nullptr).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(taken.Export().ok());
}

TEST_F(CudaIpcTest, ChildStreamWaitsOnParentsInterprocessEventBeforeCopying) {
  DeviceBuffer buffer;
  ASSERT_NO_FATAL_FAILURE(AllocatePatterned(buffer));
  absl::StatusOr<IpcEvent> ready = IpcEvent::Create(0);
  ASSERT_TRUE(ready.ok()) << ready.status();
  absl::StatusOr<std::string> event_handle = ready->Export();
  ASSERT_TRUE(event_handle.ok()) << event_handle.status();
  ASSERT_EQ(event_handle->size(), kCudaIpcHandleBytes);
  absl::StatusOr<IpcMemoryRef> ref =
      ExportDeviceMemory(buffer.bytes() + kLentOffset, kLentBytes);
  ASSERT_TRUE(ref.ok()) << ref.status();

  // The memset, and so the event, are held back until the child's copy is
  // enqueued behind its wait: a copy that did not wait reads the pattern.
  GatedStream gated;
  ASSERT_OK(gated.Start());
  ASSERT_CUDA(cudaMemsetAsync(buffer.bytes() + kLentOffset, kMemsetByte,
                              kLentBytes, gated.stream()));
  ASSERT_OK(ready->Record(gated.stream()));
  absl::StatusOr<bool> done = ready->Done();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(*done);

  std::vector<std::string> args = RefArgs(*ref);
  args.insert(args.begin(), absl::BytesToHexString(*event_handle));
  absl::StatusOr<std::unique_ptr<Child>> child =
      Child::Start("event_wait", args);
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<std::string> line = (*child)->ReadLine(kChildTimeout);
  ASSERT_TRUE(line.ok()) << line.status();
  ASSERT_EQ(*line, "enqueued");
  gated.Open();
  ASSERT_OK((*child)->WriteLine("go"));
  ASSERT_OK(ready->Synchronize());
  done = ready->Done();
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_TRUE(*done);
  line = (*child)->ReadLine(kChildTimeout);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(*line, "done");
  absl::StatusOr<int> code = (*child)->Wait(kChildTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

TEST_F(CudaIpcTest,
       MapOpensTwoRefsIntoOneAllocationOnceAndClosesOnDestruction) {
  DeviceBuffer buffer;
  ASSERT_NO_FATAL_FAILURE(AllocatePatterned(buffer));
  absl::StatusOr<IpcMemoryRef> a = ExportDeviceMemory(buffer.ptr, 4096);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<IpcMemoryRef> b =
      ExportDeviceMemory(buffer.bytes() + (512 << 10), 4096);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->handle, b->handle) << "one allocation, two handles";
  std::vector<std::string> args = RefArgs(*a);
  for (std::string& arg : RefArgs(*b)) args.push_back(std::move(arg));
  ASSERT_NO_FATAL_FAILURE(RunChildToSuccess("dedupe", args));
}

TEST_F(CudaIpcTest, TwentyExportOpenRoundsLeakNoDeviceMemory) {
  constexpr uint64_t kRoundBytes = uint64_t{8} << 20;
  auto round = [&]() {
    DeviceBuffer buffer;
    ASSERT_NO_FATAL_FAILURE(AllocatePatterned(buffer, kRoundBytes));
    absl::StatusOr<IpcMemoryRef> ref =
        ExportDeviceMemory(buffer.bytes() + (1 << 20), 1 << 20);
    ASSERT_TRUE(ref.ok()) << ref.status();
    ASSERT_NO_FATAL_FAILURE(RunChildToSuccess("read_write", RefArgs(*ref)));
    absl::StatusOr<std::vector<uint32_t>> seen =
        ReadWords(buffer.bytes() + (1 << 20), (1 << 20) / 4);
    ASSERT_TRUE(seen.ok()) << seen.status();
    ASSERT_OK(CheckWords(*seen, (1 << 20) / 4, ChildPattern, "after child"));
  };
  ASSERT_NO_FATAL_FAILURE(round());  // warm-up: contexts, pools
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  for (int i = 0; i < 20; ++i)
    ASSERT_NO_FATAL_FAILURE(round()) << "round " << i;
  // A child's context is torn down as it exits; give the driver a moment.
  const uint64_t tolerance = uint64_t{4} << 20;
  for (int poll = 0; poll < 100; ++poll) {
    ASSERT_CUDA(cudaMemGetInfo(&free_after, &total));
    if (free_after + tolerance >= free_before) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_GE(free_after + tolerance, free_before)
      << "device memory in use grew by "
      << (free_before - free_after) / (1 << 20) << " MiB over 20 rounds";
}

}  // namespace
}  // namespace ipc_test
}  // namespace muonps

int main(int argc, char** argv) {
  const size_t flag_length = std::strlen(muonps::ipc_test::kChildFlag);
  if (argc >= 2 &&
      std::strncmp(argv[1], muonps::ipc_test::kChildFlag, flag_length) == 0) {
    return muonps::ipc_test::RunIpcChild(
        argv[1] + flag_length, std::vector<std::string>(argv + 2, argv + argc));
  }
  // A child that dies early must fail a write, not kill the test.
  signal(SIGPIPE, SIG_IGN);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
