#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/low_precision.cuh"
#include "kernels/cuda/ns_elementwise.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// Blocks per matrix for a grid of (blocks, count): about 1024 blocks in all,
// at least one, and none with nothing to do.
int BlocksPerMatrix(int64_t count, int64_t elements) {
  int64_t per = (elements + kThreads * 8 - 1) / (kThreads * 8);
  int64_t cap = 1024 / (count > 0 ? count : 1);
  if (cap < 1) cap = 1;
  if (per > cap) per = cap;
  return static_cast<int>(per < 1 ? 1 : per);
}

__global__ void SumOfSquaresKernel(const float* x, int64_t elements,
                                   double* sums, bool vectorized) {
  const float* mat = x + blockIdx.y * elements;
  const int64_t start =
      blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double acc = 0;
  if (vectorized) {
    const float4* v = reinterpret_cast<const float4*>(mat);
    for (int64_t i = start; i < elements / 4; i += stride) {
      const float4 f = v[i];
      acc += static_cast<double>(f.x) * f.x + static_cast<double>(f.y) * f.y +
             static_cast<double>(f.z) * f.z + static_cast<double>(f.w) * f.w;
    }
  } else {
    for (int64_t i = start; i < elements; i += stride) {
      acc += static_cast<double>(mat[i]) * mat[i];
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    acc += __shfl_down_sync(0xffffffffu, acc, offset);
  }
  __shared__ double warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
    atomicAdd(&sums[blockIdx.y], total);
  }
}

// x / denom as the CPU backend computes it.
struct Normalizer {
  float inv;
  double denom;
  bool use_inv;
  __device__ Normalizer(double sum, double margin, double eps) {
    denom = fmax(margin * sqrt(sum), eps);
    inv = __double2float_rn(1.0 / denom);
    use_inv = isfinite(inv) && fabsf(inv) >= FLT_MIN;
  }
  __device__ __forceinline__ float operator()(float x) const {
    return use_inv ? __fmul_rn(x, inv)
                   : __double2float_rn(static_cast<double>(x) / denom);
  }
};

template <typename T>
__global__ void NormalizeKernel(const float* x, int64_t elements,
                                const double* sums, double margin, double eps,
                                float* out32, T* out_low, float low_scale,
                                bool vectorized) {
  const Normalizer normalize(sums[blockIdx.y], margin, eps);
  const int64_t base = blockIdx.y * elements;
  const int64_t start =
      blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (vectorized) {
    for (int64_t i = start; i < elements / 4; i += stride) {
      float4 f = reinterpret_cast<const float4*>(x + base)[i];
      f = make_float4(normalize(f.x), normalize(f.y), normalize(f.z),
                      normalize(f.w));
      if (out32 != nullptr) reinterpret_cast<float4*>(out32 + base)[i] = f;
      if (out_low != nullptr) {
        const float v[4] = {f.x, f.y, f.z, f.w};
        Store4<T>(out_low + base + 4 * i, v, low_scale);
      }
    }
    return;
  }
  for (int64_t i = start; i < elements; i += stride) {
    const float v = normalize(x[base + i]);
    if (out32 != nullptr) out32[base + i] = v;
    if (out_low != nullptr) out_low[base + i] = FromFloat<T>(v * low_scale);
  }
}

template <typename T>
__global__ void CastKernel(const float* x, int64_t total, T* out, float scale,
                           bool vectorized) {
  const int64_t start =
      blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (vectorized) {
    for (int64_t i = start; i < total / 4; i += stride) {
      const float4 f = reinterpret_cast<const float4*>(x)[i];
      const float v[4] = {f.x, f.y, f.z, f.w};
      Store4<T>(out + 4 * i, v, scale);
    }
    return;
  }
  for (int64_t i = start; i < total; i += stride) {
    out[i] = FromFloat<T>(x[i] * scale);
  }
}

// Uniform values in [-scale, scale) from a hash of the index: full,
// varied mantissas, as real operands have.
template <typename T>
__global__ void FillRandomKernel(T* out, int64_t total, uint32_t seed,
                                 float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += stride) {
    uint32_t h = static_cast<uint32_t>(i) * 0x9e3779b1u ^
                 static_cast<uint32_t>(i >> 32) * 0x85ebca77u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    h *= 0x846ca68bu;
    h ^= h >> 16;
    out[i] =
        FromFloat<T>((static_cast<float>(h >> 8) * 0x1.0p-23f - 1.0f) * scale);
  }
}

template <typename T>
cudaError_t FillRandom(void* out, int64_t total, uint32_t seed, float scale,
                       cudaStream_t stream) {
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > 4096) blocks = 4096;
  FillRandomKernel<T><<<static_cast<int>(blocks), kThreads, 0, stream>>>(
      static_cast<T*>(out), total, seed, scale);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Normalize(const float* x, int64_t count, int64_t elements,
                      const double* sums, double margin, double eps,
                      float* out32, void* out_low, float low_scale,
                      cudaStream_t stream) {
  const dim3 grid(BlocksPerMatrix(count, elements), static_cast<int>(count));
  const bool vectorized = elements % 4 == 0 && Aligned(x, 16) &&
                          Aligned(out32, 16) && Aligned(out_low, 4 * sizeof(T));
  NormalizeKernel<T><<<grid, kThreads, 0, stream>>>(
      x, elements, sums, margin, eps, out32, static_cast<T*>(out_low),
      low_scale, vectorized);
  return cudaGetLastError();
}

template <typename T>
cudaError_t Cast(const float* x, int64_t total, void* out, float scale,
                 cudaStream_t stream) {
  int64_t blocks = (total / 4 + kThreads - 1) / kThreads;
  if (blocks > 4096) blocks = 4096;
  if (blocks < 1) blocks = 1;
  const bool vectorized =
      total % 4 == 0 && Aligned(x, 16) && Aligned(out, 4 * sizeof(T));
  CastKernel<T><<<static_cast<int>(blocks), kThreads, 0, stream>>>(
      x, total, static_cast<T*>(out), scale, vectorized);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSumOfSquares(const float* x, int64_t count, int64_t elements,
                               double* sums, cudaStream_t stream) {
  if (count <= 0 || elements <= 0) return cudaSuccess;
  const cudaError_t error =
      cudaMemsetAsync(sums, 0, sizeof(double) * count, stream);
  if (error != cudaSuccess) return error;
  const dim3 grid(BlocksPerMatrix(count, elements), static_cast<int>(count));
  SumOfSquaresKernel<<<grid, kThreads, 0, stream>>>(
      x, elements, sums, elements % 4 == 0 && Aligned(x, 16));
  return cudaGetLastError();
}

cudaError_t LaunchNormalize(const float* x, int64_t count, int64_t elements,
                            const double* sums, double margin, double eps,
                            float* out32, void* out_low, cudaDataType low_type,
                            float low_scale, cudaStream_t stream) {
  if (count <= 0 || elements <= 0) return cudaSuccess;
  switch (low_type) {
    case CUDA_R_16BF:
      return Normalize<__nv_bfloat16>(x, count, elements, sums, margin, eps,
                                      out32, out_low, low_scale, stream);
    case CUDA_R_16F:
      return Normalize<__half>(x, count, elements, sums, margin, eps, out32,
                               out_low, low_scale, stream);
    case CUDA_R_32F:
      return Normalize<float>(x, count, elements, sums, margin, eps, out32,
                              out_low, low_scale, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchCast(const float* x, int64_t total, void* out_low,
                       cudaDataType low_type, float low_scale,
                       cudaStream_t stream) {
  if (total <= 0) return cudaSuccess;
  switch (low_type) {
    case CUDA_R_16BF:
      return Cast<__nv_bfloat16>(x, total, out_low, low_scale, stream);
    case CUDA_R_16F:
      return Cast<__half>(x, total, out_low, low_scale, stream);
    case CUDA_R_32F:
      return Cast<float>(x, total, out_low, low_scale, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchFillRandom(void* out, int64_t total, cudaDataType type,
                             uint32_t seed, float scale, cudaStream_t stream) {
  if (total <= 0) return cudaSuccess;
  switch (type) {
    case CUDA_R_16BF:
      return FillRandom<__nv_bfloat16>(out, total, seed, scale, stream);
    case CUDA_R_16F:
      return FillRandom<__half>(out, total, seed, scale, stream);
    case CUDA_R_32F:
      return FillRandom<float>(out, total, seed, scale, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
