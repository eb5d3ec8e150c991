#include "bench/ns_gpu/gpu_timing.h"

#include <cublas_v2.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/cublas_status.h"

namespace muonps {
namespace bench {
namespace {

// Untimed GEMMs before the timer's own warm-up (~0.15 s at 8192^3).
constexpr int kExtraWarmup = 100;

// Random bf16 bit patterns of values in [-1, 1) (round to nearest even).
std::vector<uint16_t> RandomBf16(int64_t count, uint64_t seed) {
  std::vector<uint16_t> values(count);
  uint64_t state = seed;
  for (uint16_t& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float f =
        static_cast<float>(static_cast<double>(state >> 40) * 0x1.0p-23 - 1.0);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    bits += 0x7FFF + ((bits >> 16) & 1);
    v = static_cast<uint16_t>(bits >> 16);
  }
  return values;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EventTimer>> EventTimer::Create(
    cudaStream_t stream, int warmup, int repeats) {
  if (repeats < 1) return InvalidField("repeats", "must be >= 1");
  std::unique_ptr<EventTimer> timer(new EventTimer(stream, warmup, repeats));
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaEventCreate(&timer->start_), "cudaEventCreate"));
  MUONPS_RETURN_IF_ERROR(
      CudaStatus(cudaEventCreate(&timer->stop_), "cudaEventCreate"));
  return timer;
}

EventTimer::~EventTimer() {
  if (start_ != nullptr) cudaEventDestroy(start_);
  if (stop_ != nullptr) cudaEventDestroy(stop_);
}

absl::StatusOr<double> EventTimer::MedianMs(
    const std::function<absl::Status()>& work) {
  for (int i = 0; i < warmup_; ++i) MUONPS_RETURN_IF_ERROR(work());
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "warm-up"));
  std::vector<double> times;
  for (int i = 0; i < repeats_; ++i) {
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(start_, stream_), "cudaEventRecord"));
    MUONPS_RETURN_IF_ERROR(work());
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(stop_, stream_), "cudaEventRecord"));
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaEventSynchronize(stop_), "timed work"));
    float ms = 0;
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaEventElapsedTime(&ms, start_, stop_), "elapsed time"));
    times.push_back(ms);
  }
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "a kernel launch"));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

absl::StatusOr<double> CublasBf16GemmMs(EventTimer& timer, int64_t n) {
  const size_t bytes = static_cast<size_t>(n * n) * sizeof(uint16_t);
  void* matrices[3] = {nullptr, nullptr, nullptr};
  cublasHandle_t handle = nullptr;
  auto run = [&]() -> absl::StatusOr<double> {
    for (int i = 0; i < 3; ++i) {
      MUONPS_RETURN_IF_ERROR(
          CudaStatus(cudaMalloc(&matrices[i], bytes), "cudaMalloc (GEMM)"));
    }
    for (int i = 0; i < 2; ++i) {
      const std::vector<uint16_t> host = RandomBf16(n * n, i + 1);
      MUONPS_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(matrices[i], host.data(), bytes, cudaMemcpyHostToDevice),
          "cudaMemcpy (GEMM)"));
    }
    MUONPS_RETURN_IF_ERROR(
        kernels::cuda::CublasStatus(cublasCreate(&handle), "cublasCreate"));
    MUONPS_RETURN_IF_ERROR(kernels::cuda::CublasStatus(
        cublasSetStream(handle, timer.stream()), "cublasSetStream"));
    const float alpha = 1.0f;
    const float beta = 0.0f;
    const int dim = static_cast<int>(n);
    auto gemm = [&]() {
      return kernels::cuda::CublasStatus(
          cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, dim, dim, dim, &alpha,
                       matrices[0], CUDA_R_16BF, dim, matrices[1], CUDA_R_16BF,
                       dim, &beta, matrices[2], CUDA_R_16BF, dim,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16)");
    };
    // Clocks up before timing: the GPU may have been idle.
    for (int i = 0; i < kExtraWarmup; ++i) MUONPS_RETURN_IF_ERROR(gemm());
    return timer.MedianMs(gemm);
  };
  absl::StatusOr<double> ms = run();
  if (handle != nullptr) cublasDestroy(handle);
  for (void* matrix : matrices) {
    if (matrix != nullptr) cudaFree(matrix);
  }
  return ms;
}

}  // namespace bench
}  // namespace muonps
