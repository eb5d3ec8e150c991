// Where a buffer lives and the stream a data-path call is ordered on: the
// vocabulary the kernels, the transports and the worker's step share, low
// enough that none of them reaches up for it (no CUDA header needed).
//
// Data-path calls take a Stream, as NCCL's and cuBLAS's do. On a device
// they enqueue on that stream and return; the work is done when the stream
// reaches it. Host memory has no stream: host calls take kHostStream and
// have finished when they return. Plain values; thread-safe.
#ifndef MUONPS_COMMON_DEVICE_H_
#define MUONPS_COMMON_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// The CUDA runtime's stream type is `CUstream_st*` (cudaStream_t); naming
// the struct here keeps CUDA headers out of host-only code.
struct CUstream_st;

namespace muonps {

using Stream = CUstream_st*;
inline constexpr Stream kHostStream = nullptr;

enum class MemoryKind {
  kHost,  // ordinary or shared host memory
  kCuda,  // device memory of one CUDA device
};

// A place memory lives: the host, or CUDA device `ordinal`.
struct Device {
  MemoryKind kind = MemoryKind::kHost;
  int ordinal = 0;

  bool is_cuda() const { return kind == MemoryKind::kCuda; }
  friend bool operator==(const Device& a, const Device& b) {
    return a.kind == b.kind &&
           (a.kind == MemoryKind::kHost || a.ordinal == b.ordinal);
  }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

inline constexpr Device kHostDevice{};

// "cpu" or "cuda:N" (the worker's --device flag).
std::string DeviceName(const Device& device);
// Parses "cpu", "cuda" (ordinal 0) or "cuda:N"; INVALID_ARGUMENT naming
// `device` otherwise.
absl::StatusOr<Device> ParseDevice(absl::string_view text);

}  // namespace muonps

#endif  // MUONPS_COMMON_DEVICE_H_
