#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/ns_elementwise.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

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

template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

bool Aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

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
        Pack4<T> p;
        p.v[0] = FromFloat<T>(f.x * low_scale);
        p.v[1] = FromFloat<T>(f.y * low_scale);
        p.v[2] = FromFloat<T>(f.z * low_scale);
        p.v[3] = FromFloat<T>(f.w * low_scale);
        reinterpret_cast<Pack4<T>*>(out_low + base)[i] = p;
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
      Pack4<T> p;
      p.v[0] = FromFloat<T>(f.x * scale);
      p.v[1] = FromFloat<T>(f.y * scale);
      p.v[2] = FromFloat<T>(f.z * scale);
      p.v[3] = FromFloat<T>(f.w * scale);
      reinterpret_cast<Pack4<T>*>(out)[i] = p;
    }
    return;
  }
  for (int64_t i = start; i < total; i += stride) {
    out[i] = FromFloat<T>(x[i] * scale);
  }
}

// One lower-triangle kSymTile x kSymTile tile (bi >= bj) per block: read
// once (fp32, V-wide loads), combined in registers, staged in shared
// memory, then written as tile (bi, bj) and, transposed, as its mirror
// (bj, bi) with V-wide stores, so every input element is read once and
// every output element written once. V = 4 needs m % 4 == 0 and 16-byte
// aligned matrices.
constexpr int kSymTile = 64;

template <typename T, int V>
__device__ __forceinline__ void StoreRow(T* out, int64_t at, const float* v,
                                         float scale, int count) {
  if (V == 4 && count == 4) {
    Pack4<T> p;  // 4 * sizeof(T)-aligned: m % 4 == 0 and aligned bases
#pragma unroll
    for (int i = 0; i < 4; ++i) p.v[i] = FromFloat<T>(v[i] * scale);
    *reinterpret_cast<Pack4<T>*>(out + at) = p;
    return;
  }
  for (int i = 0; i < count; ++i) out[at + i] = FromFloat<T>(v[i] * scale);
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    SymmetricCombineKernel(SymmetricCombine args, T* value_low,
                           T* with_diag_low) {
  __shared__ float vs[kSymTile][kSymTile + 1];
  constexpr int kGroups = kSymTile / V;  // threads per row
  constexpr int kRowsPerPass = kThreads / kGroups;
  const int64_t m = args.m;
  const int64_t offset = blockIdx.y * m * m;
  const int64_t k = blockIdx.x;
  int64_t bi = static_cast<int64_t>((sqrt(8.0 * k + 1) - 1) / 2);
  while (bi * (bi + 1) / 2 > k) --bi;
  while ((bi + 1) * (bi + 2) / 2 <= k) ++bi;
  const int64_t bj = k - bi * (bi + 1) / 2;
  const int col = (threadIdx.x % kGroups) * V;
  const int row0 = threadIdx.x / kGroups;
  for (int row = row0; row < kSymTile; row += kRowsPerPass) {
    const int64_t r = bi * kSymTile + row;
    const int64_t c = bj * kSymTile + col;
    if (r >= m || c >= m) continue;
    const int64_t at = offset + r * m + c;
    float a[V], a2[V];
    if constexpr (V == 4) {
      const float4 f = *reinterpret_cast<const float4*>(args.a + at);
      a[0] = f.x, a[1] = f.y, a[2] = f.z, a[3] = f.w;
      if (args.a2 != nullptr) {
        const float4 g = *reinterpret_cast<const float4*>(args.a2 + at);
        a2[0] = g.x, a2[1] = g.y, a2[2] = g.z, a2[3] = g.w;
      }
    } else {
      a[0] = args.a[at];
      if (args.a2 != nullptr) a2[0] = args.a2[at];
    }
#pragma unroll
    for (int i = 0; i < V; ++i) {
      float v = __fmul_rn(args.coef_a, a[i]);
      if (args.a2 != nullptr) v = __fadd_rn(v, __fmul_rn(args.coef_a2, a2[i]));
      vs[row][col + i] = v;
      if (args.unhealthy != nullptr && r == c + i &&
          !(a[i] >= 0.0f && isfinite(a[i]))) {
        atomicAdd(args.unhealthy, 1u);
      }
    }
  }
  __syncthreads();
  for (int mirror = 0; mirror < (bi == bj ? 1 : 2); ++mirror) {
    const int64_t row_tile = mirror ? bj : bi, col_tile = mirror ? bi : bj;
    for (int row = row0; row < kSymTile; row += kRowsPerPass) {
      const int64_t r = row_tile * kSymTile + row;
      const int64_t c = col_tile * kSymTile + col;
      if (r >= m || c >= m) continue;
      const int count = static_cast<int>(m - c < V ? m - c : V);
      float v[V], w[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const bool direct = !mirror && (bi > bj || row >= col + i);
        v[i] = direct ? vs[row][col + i] : vs[col + i][row];
        w[i] = r == c + i ? __fadd_rn(v[i], args.diag) : v[i];
      }
      const int64_t at = offset + r * m + c;
      if (value_low != nullptr) {
        StoreRow<T, V>(value_low, at, v, args.value_scale, count);
      }
      if (args.value32 != nullptr) {
        StoreRow<float, V>(args.value32, at, v, 1.0f, count);
      }
      if (with_diag_low != nullptr) {
        StoreRow<T, V>(with_diag_low, at, w, args.with_diag_scale, count);
      }
    }
  }
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

template <typename T>
cudaError_t Combine(const SymmetricCombine& args, cudaStream_t stream) {
  const int64_t tiles = (args.m + kSymTile - 1) / kSymTile;
  const dim3 grid(static_cast<unsigned>(tiles * (tiles + 1) / 2),
                  static_cast<unsigned>(args.count));
  const bool vectorized = args.m % 4 == 0 && Aligned(args.a, 16) &&
                          Aligned(args.a2, 16) && Aligned(args.value32, 16) &&
                          Aligned(args.value_low, 4 * sizeof(T)) &&
                          Aligned(args.with_diag_low, 4 * sizeof(T));
  T* value_low = static_cast<T*>(args.value_low);
  T* with_diag_low = static_cast<T*>(args.with_diag_low);
  if (vectorized) {
    SymmetricCombineKernel<T, 4>
        <<<grid, kThreads, 0, stream>>>(args, value_low, with_diag_low);
  } else {
    SymmetricCombineKernel<T, 1>
        <<<grid, kThreads, 0, stream>>>(args, value_low, with_diag_low);
  }
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

cudaError_t LaunchSymmetricCombine(const SymmetricCombine& args,
                                   cudaStream_t stream) {
  if (args.count <= 0 || args.m <= 0) return cudaSuccess;
  switch (args.low_type) {
    case CUDA_R_16BF:
      return Combine<__nv_bfloat16>(args, stream);
    case CUDA_R_16F:
      return Combine<__half>(args, stream);
    case CUDA_R_32F:
      return Combine<float>(args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
