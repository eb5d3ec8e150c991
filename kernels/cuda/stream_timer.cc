#include "kernels/cuda/stream_timer.h"

#include <algorithm>
#include <vector>

#include "common/cuda_status.h"
#include "common/status.h"

namespace muonps {
namespace kernels {
namespace cuda {

absl::StatusOr<std::unique_ptr<StreamTimer>> StreamTimer::Create() {
  std::unique_ptr<StreamTimer> timer(new StreamTimer());
  MUONPS_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&timer->stream_, cudaStreamNonBlocking));
  MUONPS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timer->start_));
  MUONPS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timer->stop_));
  return timer;
}

StreamTimer::~StreamTimer() {
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (stop_ != nullptr) cudaEventDestroy(stop_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<double> StreamTimer::MedianMs(
    const std::function<absl::Status(cudaStream_t)>& run) {
  std::vector<float> times;
  for (int rep = -1; rep < 3; ++rep) {  // rep -1: the warm-up
    MUONPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream_));
    MUONPS_RETURN_IF_ERROR(run(stream_));
    MUONPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, stream_));
    MUONPS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_));
    float ms = 0;
    MUONPS_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    if (rep >= 0) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return static_cast<double>(times[times.size() / 2]);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
