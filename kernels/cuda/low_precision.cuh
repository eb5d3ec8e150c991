// Device-side helpers shared by the CUDA backend's kernels: fp32 to GEMM-input
// conversion with round-to-nearest, 4-wide packed stores, alignment tests.
// Header-only, for .cu files.
#ifndef MUONPS_KERNELS_CUDA_LOW_PRECISION_CUH_
#define MUONPS_KERNELS_CUDA_LOW_PRECISION_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace muonps {
namespace kernels {
namespace cuda {

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}

// Stores v[0..3] * scale as four T with one 4 * sizeof(T)-byte access
// (explicit vector types, so the compiler never splits it); `out` must be
// 4 * sizeof(T)-byte aligned.
template <typename T>
__device__ __forceinline__ void Store4(T* out, const float* v, float scale);
template <>
__device__ __forceinline__ void Store4<float>(float* out, const float* v,
                                              float scale) {
  *reinterpret_cast<float4*>(out) =
      make_float4(v[0] * scale, v[1] * scale, v[2] * scale, v[3] * scale);
}
template <>
__device__ __forceinline__ void Store4<__nv_bfloat16>(__nv_bfloat16* out,
                                                      const float* v,
                                                      float scale) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0] * scale, v[1] * scale);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2] * scale, v[3] * scale);
  uint2 bits;
  bits.x = *reinterpret_cast<const unsigned int*>(&lo);
  bits.y = *reinterpret_cast<const unsigned int*>(&hi);
  *reinterpret_cast<uint2*>(out) = bits;
}
template <>
__device__ __forceinline__ void Store4<__half>(__half* out, const float* v,
                                               float scale) {
  const __half2 lo = __floats2half2_rn(v[0] * scale, v[1] * scale);
  const __half2 hi = __floats2half2_rn(v[2] * scale, v[3] * scale);
  uint2 bits;
  bits.x = *reinterpret_cast<const unsigned int*>(&lo);
  bits.y = *reinterpret_cast<const unsigned int*>(&hi);
  *reinterpret_cast<uint2*>(out) = bits;
}

inline bool Aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_LOW_PRECISION_CUH_
