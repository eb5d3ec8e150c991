#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/aol_scaling.h"
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

// One block per contiguous line of the stack: a row of a row-major wide
// matrix (one scale for the line) or a row of a tall matrix stored
// row-major (element j of the line belongs to wide row j). No per-element
// index division; 4-wide accesses where the line allows.
template <typename T>
__global__ void ScaleRowsKernel(float* x32, T* x_low, float low_scale,
                                int64_t line_length, int64_t m, int64_t n,
                                bool row_major, const float* scales,
                                bool vectorized) {
  const int64_t line = blockIdx.x;
  float* x = x32 + line * line_length;
  T* low = x_low != nullptr ? x_low + line * line_length : nullptr;
  // Row-major: line = matrix * m + row. Tall: line = matrix * n + column.
  const float* s = row_major ? scales + line : scales + (line / n) * m;
  if (vectorized) {
    for (int64_t j = 4 * threadIdx.x; j < line_length; j += 4 * blockDim.x) {
      float4 v = *reinterpret_cast<const float4*>(x + j);
      if (row_major) {
        const float f = s[0];
        v.x *= f, v.y *= f, v.z *= f, v.w *= f;
      } else {
        v.x *= s[j], v.y *= s[j + 1], v.z *= s[j + 2], v.w *= s[j + 3];
      }
      *reinterpret_cast<float4*>(x + j) = v;
      if (low != nullptr) {
        const float w[4] = {v.x, v.y, v.z, v.w};
        Store4<T>(low + j, w, low_scale);
      }
    }
    return;
  }
  for (int64_t j = threadIdx.x; j < line_length; j += blockDim.x) {
    const float v = x[j] * (row_major ? s[0] : s[j]);
    x[j] = v;
    if (low != nullptr) low[j] = FromFloat<T>(v * low_scale);
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
cudaError_t Scales(const void* a_low, float low_scale, int64_t count, int64_t m,
                   double margin, float* scales, cudaStream_t stream) {
  AolScalesKernel<T><<<static_cast<unsigned>(count * m), kThreads, 0, stream>>>(
      static_cast<const T*>(a_low), m, 1.0f / low_scale, margin, scales);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Rows(float* x32, void* x_low, float low_scale, int64_t count,
                 int64_t m, int64_t n, bool row_major, const float* scales,
                 cudaStream_t stream) {
  const int64_t line_length = row_major ? n : m;
  const int64_t lines = count * (row_major ? m : n);
  const bool vectorized =
      line_length % 4 == 0 && Aligned(x32, 16) && Aligned(x_low, 4 * sizeof(T));
  ScaleRowsKernel<T><<<static_cast<unsigned>(lines), kThreads, 0, stream>>>(
      x32, static_cast<T*>(x_low), low_scale, line_length, m, n, row_major,
      scales, vectorized);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAolScales(const void* a_low, cudaDataType low_type,
                            float low_scale, int64_t count, int64_t m,
                            double margin, float* scales, cudaStream_t stream) {
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
