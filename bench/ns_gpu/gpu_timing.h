// Timing on one CUDA stream for bench/ns_gpu: CUDA events around the timed
// work, warm-up calls first, the median of the repeats; and cuBLAS's bf16
// GEMM rate measured the same way, as the ceiling NS is compared with.
//
// Not safe for concurrent use; one thread drives the stream.
#ifndef MUONPS_BENCH_NS_GPU_GPU_TIMING_H_
#define MUONPS_BENCH_NS_GPU_GPU_TIMING_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace bench {

class EventTimer {
 public:
  // Creates the two events on the current device; `stream` is borrowed and
  // must outlive the timer.
  static absl::StatusOr<std::unique_ptr<EventTimer>> Create(cudaStream_t stream,
                                                            int warmup,
                                                            int repeats);
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer();

  // Runs `work` (which queues its GPU work on the stream) `warmup` times,
  // then `repeats` times between two events, and returns the median
  // milliseconds between them. Fails with the first error of `work` or of
  // the device (after a synchronize, so asynchronous errors surface here).
  absl::StatusOr<double> MedianMs(const std::function<absl::Status()>& work);

  cudaStream_t stream() const { return stream_; }

 private:
  EventTimer(cudaStream_t stream, int warmup, int repeats)
      : stream_(stream), warmup_(warmup), repeats_(repeats) {}

  cudaStream_t stream_;
  int warmup_;
  int repeats_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

// Milliseconds of one n x n x n cublasGemmEx with bf16 A, B and C and fp32
// accumulation (what torch.matmul runs for bf16) on random data, timed by
// `timer`, after 100 untimed products that bring the clocks up. Allocates
// and frees its three matrices.
absl::StatusOr<double> CublasBf16GemmMs(EventTimer& timer, int64_t n);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_NS_GPU_GPU_TIMING_H_
