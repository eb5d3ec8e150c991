#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/low_precision.cuh"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// torch.lerp's two-sided form with explicit rounding (no contraction into
// fused multiply-adds), so results equal the CPU backend's bit for bit.
__device__ __forceinline__ float Lerp(float start, float end, float weight) {
  return weight < 0.5f
             ? __fadd_rn(start, __fmul_rn(weight, __fsub_rn(end, start)))
             : __fsub_rn(end, __fmul_rn(__fsub_rn(end, start),
                                        __fsub_rn(1.0f, weight)));
}

// True when a guard holds the index of a non-finite element.
__device__ __forceinline__ bool Rejected(const unsigned long long* first_bad) {
  return first_bad != nullptr &&
         *first_bad < static_cast<unsigned long long>(INT64_MAX);
}

// True when every pointer is 16-byte aligned: the kernels below then move
// four floats per load and store (the same arithmetic per element).
__host__ __device__ inline bool Aligned16(const void* a,
                                          const void* b = nullptr,
                                          const void* c = nullptr,
                                          const void* d = nullptr) {
  return ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
           reinterpret_cast<uintptr_t>(c) | reinterpret_cast<uintptr_t>(d)) &
          15) == 0;
}

// Calls op(i) for every i < count, four consecutive indices per call of
// op4(i) where `vector` (i a multiple of 4), grid-stride.
template <typename Op4, typename Op>
__device__ __forceinline__ void ForEach(int64_t count, bool vector, Op4 op4,
                                        Op op) {
  const int64_t start =
      blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (vector) {
    const int64_t quads = count / 4;
    for (int64_t q = start; q < quads; q += stride) op4(4 * q);
    done = 4 * quads;
  }
  for (int64_t i = done + start; i < count; i += stride) op(i);
}

int Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

__global__ void MomentumKernel(const float* grad, const float* previous,
                               float* momentum, float* update, int64_t count,
                               float mu, float keep, bool nesterov,
                               const unsigned long long* first_bad) {
  if (Rejected(first_bad)) return;
  auto one = [&](float g, float m, float* buf, float* out) {
    *buf = Lerp(m, g, keep);
    *out = nesterov ? Lerp(g, *buf, mu) : *buf;
  };
  ForEach(
      count, Aligned16(grad, previous, momentum, update),
      [&](int64_t i) {
        const float4 g = *reinterpret_cast<const float4*>(grad + i);
        const float4 m = *reinterpret_cast<const float4*>(previous + i);
        float4 b, u;
        one(g.x, m.x, &b.x, &u.x);
        one(g.y, m.y, &b.y, &u.y);
        one(g.z, m.z, &b.z, &u.z);
        one(g.w, m.w, &b.w, &u.w);
        *reinterpret_cast<float4*>(momentum + i) = b;
        *reinterpret_cast<float4*>(update + i) = u;
      },
      [&](int64_t i) {
        float b, u;
        one(grad[i], previous[i], &b, &u);
        momentum[i] = b;
        update[i] = u;
      });
}

// An element of a parameter or update as fp32 (FromFloat of
// low_precision.cuh rounds back, nearest even).
__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ float Widen(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float Widen(__half v) { return __half2float(v); }
// Four consecutive elements as fp32 with one 4 * sizeof(T)-byte access; `p`
// must be that aligned (Store4 of low_precision.cuh writes them back).
__device__ __forceinline__ void Load4(const float* p, float v[4]) {
  const float4 x = *reinterpret_cast<const float4*>(p);
  v[0] = x.x;
  v[1] = x.y;
  v[2] = x.z;
  v[3] = x.w;
}
template <typename Pair>
__device__ __forceinline__ void LoadPairs(const void* p, float v[4]) {
  const uint2 bits = *reinterpret_cast<const uint2*>(p);
  const Pair lo = *reinterpret_cast<const Pair*>(&bits.x);
  const Pair hi = *reinterpret_cast<const Pair*>(&bits.y);
  v[0] = Widen(lo.x);
  v[1] = Widen(lo.y);
  v[2] = Widen(hi.x);
  v[3] = Widen(hi.y);
}
__device__ __forceinline__ void Load4(const __nv_bfloat16* p, float v[4]) {
  LoadPairs<__nv_bfloat162>(p, v);
}
__device__ __forceinline__ void Load4(const __half* p, float v[4]) {
  LoadPairs<__half2>(p, v);
}
// True when both pointers allow four-element accesses of their types.
template <typename P, typename U>
__host__ __device__ inline bool AlignedFor4(const P* param, const U* update) {
  return reinterpret_cast<uintptr_t>(param) % (4 * sizeof(P)) == 0 &&
         reinterpret_cast<uintptr_t>(update) % (4 * sizeof(U)) == 0;
}

// param <- param * decay + step * update in fp32, rounded once to P; four
// elements a thread where aligned (the same arithmetic per element).
template <typename P, typename U>
__global__ void ApplyKernel(P* param, const U* update, int64_t count,
                            float decay, float step,
                            const unsigned long long* first_bad) {
  if (Rejected(first_bad)) return;
  auto one = [&](float p, float u) {
    return __fadd_rn(__fmul_rn(p, decay), __fmul_rn(step, u));
  };
  ForEach(
      count, AlignedFor4(param, update),
      [&](int64_t i) {
        float p[4], u[4];
        Load4(param + i, p);
        Load4(update + i, u);
        for (int k = 0; k < 4; ++k) p[k] = one(p[k], u[k]);
        Store4<P>(param + i, p, 1.0f);
      },
      [&](int64_t i) {
        param[i] = FromFloat<P>(one(Widen(param[i]), Widen(update[i])));
      });
}

template <typename S, typename D>
__global__ void ConvertKernel(const S* src, D* dst, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = FromFloat<D>(Widen(src[i]));
  }
}

// Calls f(T{}) with T the element type `type` names; false for a type the
// kernels do not take.
template <typename F>
bool WithType(cudaDataType type, F f) {
  switch (type) {
    case CUDA_R_32F:
      f(float{});
      return true;
    case CUDA_R_16BF:
      f(__nv_bfloat16{});
      return true;
    case CUDA_R_16F:
      f(__half{});
      return true;
    default:
      return false;
  }
}

__global__ void ScaleKernel(float* data, int64_t count, float factor) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    data[i] = __fmul_rn(data[i], factor);
  }
}

__global__ void AdamWKernel(float* param, const float* grad, float* exp_avg,
                            float* exp_avg_sq, int64_t count, AdamWScalars s,
                            const unsigned long long* first_bad) {
  if (Rejected(first_bad)) return;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float p = __fmul_rn(param[i], s.decay);
    const float m = Lerp(exp_avg[i], g, s.keep1);
    const float v = __fadd_rn(__fmul_rn(exp_avg_sq[i], s.beta2),
                              __fmul_rn(s.keep2, __fmul_rn(g, g)));
    const float denom =
        __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias2_sqrt), s.eps);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    param[i] = __fsub_rn(p, __fmul_rn(s.step_size, __fdiv_rn(m, denom)));
  }
}

__global__ void FindNonFiniteKernel(const float* data, int64_t count,
                                    unsigned long long* first_bad) {
  auto check = [&](float v, int64_t i) {
    if (!isfinite(v)) atomicMin(first_bad, static_cast<unsigned long long>(i));
  };
  ForEach(
      count, Aligned16(data),
      [&](int64_t i) {
        const float4 v = *reinterpret_cast<const float4*>(data + i);
        check(v.x, i);
        check(v.y, i + 1);
        check(v.z, i + 2);
        check(v.w, i + 3);
      },
      [&](int64_t i) { check(data[i], i); });
}

}  // namespace

cudaError_t LaunchMomentum(const float* grad, const float* previous,
                           float* momentum, float* update, int64_t count,
                           double mu, bool nesterov, cudaStream_t stream,
                           const unsigned long long* first_bad) {
  if (count <= 0) return cudaSuccess;
  MomentumKernel<<<Blocks((count + 3) / 4), kThreads, 0, stream>>>(
      grad, previous, momentum, update, count, static_cast<float>(mu),
      static_cast<float>(1.0 - mu), nesterov, first_bad);
  return cudaGetLastError();
}

cudaError_t LaunchApplyUpdate(void* param, cudaDataType param_type,
                              const void* update, cudaDataType update_type,
                              int64_t count, float decay, float step,
                              cudaStream_t stream,
                              const unsigned long long* first_bad) {
  if (count <= 0) return cudaSuccess;
  bool known = false;
  WithType(param_type, [&](auto p) {
    using P = decltype(p);
    known = WithType(update_type, [&](auto u) {
      using U = decltype(u);
      ApplyKernel<P, U><<<Blocks((count + 3) / 4), kThreads, 0, stream>>>(
          static_cast<P*>(param), static_cast<const U*>(update), count, decay,
          step, first_bad);
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t LaunchConvert(const void* src, cudaDataType src_type, void* dst,
                          cudaDataType dst_type, int64_t count,
                          cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  bool known = false;
  WithType(src_type, [&](auto s) {
    using S = decltype(s);
    known = WithType(dst_type, [&](auto d) {
      using D = decltype(d);
      ConvertKernel<S, D><<<Blocks(count), kThreads, 0, stream>>>(
          static_cast<const S*>(src), static_cast<D*>(dst), count);
    });
  });
  return known ? cudaGetLastError() : cudaErrorInvalidValue;
}

cudaError_t LaunchScale(float* data, int64_t count, float factor,
                        cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  ScaleKernel<<<Blocks(count), kThreads, 0, stream>>>(data, count, factor);
  return cudaGetLastError();
}

cudaError_t LaunchAdamW(float* param, const float* grad, float* exp_avg,
                        float* exp_avg_sq, int64_t count,
                        const AdamWScalars& scalars, cudaStream_t stream,
                        const unsigned long long* first_bad) {
  if (count <= 0) return cudaSuccess;
  AdamWKernel<<<Blocks(count), kThreads, 0, stream>>>(
      param, grad, exp_avg, exp_avg_sq, count, scalars, first_bad);
  return cudaGetLastError();
}

cudaError_t LaunchFindNonFinite(const float* data, int64_t count,
                                unsigned long long* first_bad,
                                cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  FindNonFiniteKernel<<<Blocks((count + 3) / 4), kThreads, 0, stream>>>(
      data, count, first_bad);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
