// Times GPU work on a private stream with CUDA events, for choosing between
// ways of doing the same work on the device at hand (cuBLASLt's algorithm
// search, a Newton-Schulz shape's tile plan): one warm-up run, then the
// median of three.
//
// Owns its stream and events (created by Create, destroyed with the
// object); not copyable. One thread at a time. MedianMs waits for the
// stream, so it must not run during a graph capture.
#ifndef MUONPS_KERNELS_CUDA_STREAM_TIMER_H_
#define MUONPS_KERNELS_CUDA_STREAM_TIMER_H_

#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace muonps {
namespace kernels {
namespace cuda {

class StreamTimer {
 public:
  // The stream and its two events on the current device; the CUDA error as
  // a status otherwise.
  static absl::StatusOr<std::unique_ptr<StreamTimer>> Create();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;
  ~StreamTimer();

  // Median milliseconds of `run` (which queues its work on the stream it is
  // given) over three runs after a warm-up. The first error of `run`, or of
  // the stream's work (after waiting for it), otherwise.
  absl::StatusOr<double> MedianMs(
      const std::function<absl::Status(cudaStream_t)>& run);

 private:
  StreamTimer() = default;

  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_STREAM_TIMER_H_
