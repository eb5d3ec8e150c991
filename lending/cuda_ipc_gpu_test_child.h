// The importing side of the cuda_ipc GPU tests (cuda_ipc_memory_gpu_test,
// cuda_ipc_event_gpu_test), and what both sides share.
//
// CUDA refuses to open an IPC handle in the process that exported it, and a
// forked child cannot use CUDA once its parent has, so the test's importer
// is the test binary run again: `/proc/self/exe --ipc_child=MODE ARGS...`,
// which main() hands to RunIpcChild() before GoogleTest starts. Refs travel
// as RefArgs() in argv; the two sides pace each other with lines on the
// child's stdin and stdout; the child says on stderr why it failed.
// Test-only; thread-compatible.
#ifndef MUONPS_LENDING_CUDA_IPC_GPU_TEST_CHILD_H_
#define MUONPS_LENDING_CUDA_IPC_GPU_TEST_CHILD_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/cuda_status.h"
#include "lending/cuda_ipc.h"

namespace muonps {
namespace ipc_test {

// argv[1] of the child: kChildFlag followed by the mode.
inline constexpr char kChildFlag[] = "--ipc_child=";

// Byte the event test's memset writes over the lent range.
inline constexpr int kMemsetByte = 0x5A;

// Word i (4-byte words from the allocation's base) of what the parent
// writes into an allocation, and of what the read_write child writes over
// the lent range.
uint32_t Pattern(uint64_t i);
uint32_t ChildPattern(uint64_t i);

// A cudaMalloc'd pointer, freed with its owner.
struct DeviceBuffer {
  void* ptr = nullptr;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr != nullptr) (void)cudaFree(ptr);
  }
  char* bytes() const { return static_cast<char*>(ptr); }
};

// Sets `words` 4-byte words at device pointer `at`, which is word `first`
// of its allocation, to pattern(first + i); synchronizes the device.
absl::Status Fill(void* at, uint64_t first, uint64_t words,
                  uint32_t (*pattern)(uint64_t));

// `words` 4-byte words from device pointer `at`.
absl::StatusOr<std::vector<uint32_t>> ReadWords(const void* at, uint64_t words);

// DATA_LOSS naming the first i with at[i] != pattern(first + i), where
// `first` is at[0]'s word index in its allocation.
absl::Status CheckWords(const std::vector<uint32_t>& at, uint64_t first,
                        uint32_t (*pattern)(uint64_t), absl::string_view what);

// `ref` as four argv words: HANDLE_HEX OFFSET BYTES DEVICE.
std::vector<std::string> RefArgs(const IpcMemoryRef& ref);

// Runs child `mode` with `args` (argv after the flag) and returns the
// process's exit code: 0 after printing "done", 1 after printing why not
// to stderr. Modes:
//   read_write REF: opens REF, checks Pattern in it, writes ChildPattern.
//   event_wait EVENT_HEX REF: its copy out of REF waits on the parent's
//     event; prints "enqueued" once the copy is queued, and reads "go".
//   dedupe REF_A REF_B: two 4096-byte refs into one 1 MiB allocation open
//     as one mapping; Close, moves and destruction unmap it.
int RunIpcChild(const std::string& mode, const std::vector<std::string>& args);

}  // namespace ipc_test
}  // namespace muonps

#endif  // MUONPS_LENDING_CUDA_IPC_GPU_TEST_CHILD_H_
