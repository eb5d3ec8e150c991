// GPU test of lending/cuda_ipc's interprocess events: a child process (this
// binary run again: cuda_ipc_gpu_test_child.h says why and how) opens this
// process's event and lent memory, and its stream's copy out of that
// memory waits on the event. Needs one GPU; skips without one.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "lending/cuda_ipc.h"
#include "lending/cuda_ipc_gpu_test_child.h"
#include "lending/cuda_ipc_gpu_test_fixture.h"

namespace muonps {
namespace ipc_test {
namespace {

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
        CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                   "cudaStreamCreateWithFlags"));
    return CudaStatus(cudaLaunchHostFunc(stream_, &WaitForGate, &open_),
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

}  // namespace
}  // namespace ipc_test
}  // namespace muonps
