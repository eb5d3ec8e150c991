// GPU test of lending/cuda_ipc's device memory: this process exports, as a
// trainer does, and a child process opens, as the worker does (the child
// is this binary run again: cuda_ipc_gpu_test_child.h says why and how): a
// sub-block at its offset, two refs into one allocation mapped once, no
// device memory leaked over twenty rounds, and exports of host, managed,
// misaligned or out-of-range memory (with bad refs and events) refused.
// Needs one GPU; skips without one.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "lending/cuda_ipc.h"
#include "lending/cuda_ipc_gpu_test_child.h"
#include "lending/cuda_ipc_gpu_test_fixture.h"

namespace muonps {
namespace ipc_test {
namespace {

// Runs a child to its end and expects exit code 0.
void RunChildToSuccess(const std::string& mode,
                       const std::vector<std::string>& args) {
  absl::StatusOr<std::unique_ptr<Child>> child = Child::Start(mode, args);
  ASSERT_TRUE(child.ok()) << child.status();
  absl::StatusOr<int> code = (*child)->Wait(kChildTimeout);
  ASSERT_TRUE(code.ok()) << code.status();
  ASSERT_EQ(*code, 0) << "child " << mode << " failed: see its stderr above";
}

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
