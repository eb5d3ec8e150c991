#include "kernels/cuda/aol_scaling.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/low_precision.cuh"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float ToFloat(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) {
  return __half2float(v);
}

// One block per row of the count * m rows.
template <typename T>
__global__ void AolScalesKernel(const T* a, int64_t m, float inv_scale,
                                double margin, float* scales) {
  const int64_t row = blockIdx.x;
  const T* r = a + row * m;
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) {
    acc += fabsf(ToFloat<T>(r[j]));
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    acc += __shfl_down_sync(0xffffffffu, acc, offset);
  }
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0;
    for (int w = 0; w < kThreads / 32; ++w) sum += warp_sums[w];
    sum *= inv_scale;
    scales[row] = sum > 0 && isfinite(sum)
                      ? static_cast<float>(1.0 / (margin * sqrt(sum)))
                      : 1.0f;
  }
}

template <typename T>
__global__ void ScaleRowsKernel(float* x32, T* x_low, float low_scale,
                                int64_t total, int64_t m, int64_t n,
                                bool row_major, const float* scales) {
  const int64_t per_matrix = m * n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       e < total; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t matrix = e / per_matrix;
    const int64_t local = e - matrix * per_matrix;
    const int64_t row = row_major ? local / n : local % m;
    const float v = x32[e] * scales[matrix * m + row];
    x32[e] = v;
    if (x_low != nullptr) x_low[e] = FromFloat<T>(v * low_scale);
  }
}

__global__ void ScaleSymmetricKernel(float* a, int64_t total, int64_t m,
                                     const float* scales) {
  const int64_t per_matrix = m * m;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       e < total; e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t matrix = e / per_matrix;
    const int64_t local = e - matrix * per_matrix;
    const float* s = scales + matrix * m;
    a[e] *= s[local / m] * s[local % m];
  }
}

unsigned Blocks(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1)
                                             : 4096);
}

template <typename T>
cudaError_t Scales(const void* a_low, float low_scale, int64_t count,
                   int64_t m, double margin, float* scales,
                   cudaStream_t stream) {
  AolScalesKernel<T><<<static_cast<unsigned>(count * m), kThreads, 0, stream>>>(
      static_cast<const T*>(a_low), m, 1.0f / low_scale, margin, scales);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Rows(float* x32, void* x_low, float low_scale, int64_t count,
                 int64_t m, int64_t n, bool row_major, const float* scales,
                 cudaStream_t stream) {
  const int64_t total = count * m * n;
  ScaleRowsKernel<T><<<Blocks(total), kThreads, 0, stream>>>(
      x32, static_cast<T*>(x_low), low_scale, total, m, n, row_major, scales);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAolScales(const void* a_low, cudaDataType low_type,
                            float low_scale, int64_t count, int64_t m,
                            double margin, float* scales,
                            cudaStream_t stream) {
  if (count <= 0 || m <= 0) return cudaSuccess;
  switch (low_type) {
    case CUDA_R_16BF:
      return Scales<__nv_bfloat16>(a_low, low_scale, count, m, margin, scales,
                                   stream);
    case CUDA_R_16F:
      return Scales<__half>(a_low, low_scale, count, m, margin, scales, stream);
    case CUDA_R_32F:
      return Scales<float>(a_low, low_scale, count, m, margin, scales, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchScaleRows(float* x32, void* x_low, cudaDataType low_type,
                            float low_scale, int64_t count, int64_t m,
                            int64_t n, bool row_major, const float* scales,
                            cudaStream_t stream) {
  if (count <= 0 || m <= 0 || n <= 0) return cudaSuccess;
  switch (low_type) {
    case CUDA_R_16BF:
      return Rows<__nv_bfloat16>(x32, x_low, low_scale, count, m, n, row_major,
                                 scales, stream);
    case CUDA_R_16F:
      return Rows<__half>(x32, x_low, low_scale, count, m, n, row_major, scales,
                          stream);
    case CUDA_R_32F:
      return Rows<float>(x32, x_low, low_scale, count, m, n, row_major, scales,
                         stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchScaleSymmetric(float* a, int64_t count, int64_t m,
                                 const float* scales, cudaStream_t stream) {
  if (count <= 0 || m <= 0) return cudaSuccess;
  const int64_t total = count * m * m;
  ScaleSymmetricKernel<<<Blocks(total), kThreads, 0, stream>>>(a, total, m,
                                                               scales);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
