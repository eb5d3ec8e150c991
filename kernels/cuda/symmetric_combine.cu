// LaunchSymmetricCombine (declared in ns_elementwise.h): a persistent,
// software-pipelined kernel over the lower-triangle 64 x 64 tiles of a
// stack of symmetric matrices. Each block reads a tile once (fp32, V-wide
// loads), combines it in registers, stages it in shared memory and writes
// it as tile (bi, bj) and, transposed, as its mirror (bj, bi), while the
// loads of its next tile are already in flight. Tiles off the diagonal and
// inside the matrix (nearly all) take a lean path: tile (bi, bj) is
// written from the registers, with no per-element bounds or diagonal
// checks; only the mirror goes through shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/low_precision.cuh"
#include "kernels/cuda/ns_elementwise.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;

struct TileIndex {
  int64_t offset;  // of the matrix
  int64_t bi, bj;  // lower-triangle tile, bi >= bj
};

__device__ __forceinline__ TileIndex Decode(int64_t k, int64_t per_matrix,
                                            int64_t m) {
  TileIndex t;
  const int64_t matrix = k / per_matrix;
  const int64_t local = k - matrix * per_matrix;
  t.offset = matrix * m * m;
  int64_t bi = static_cast<int64_t>((sqrt(8.0 * local + 1) - 1) / 2);
  while (bi * (bi + 1) / 2 > local) --bi;
  while ((bi + 1) * (bi + 2) / 2 <= local) ++bi;
  t.bi = bi;
  t.bj = local - bi * (bi + 1) / 2;
  return t;
}

template <typename T, int V>
__device__ __forceinline__ void StoreRow(T* out, int64_t at, const float* v,
                                         float scale, int count) {
  if (V == 4 && count == 4) {
    Store4<T>(out + at, v, scale);  // aligned: m % 4 == 0, aligned bases
    return;
  }
  // Unrolled with a predicate, not a loop to `count`: a runtime bound would
  // index v dynamically and put it in local memory (measured: ncu showed
  // the spills making the kernel L2-bound).
#pragma unroll
  for (int i = 0; i < V; ++i) {
    if (i < count) out[at + i] = FromFloat<T>(v[i] * scale);
  }
}

template <typename T, int V>
class TileCombiner {
 public:
  static constexpr int kGroups = kTile / V;  // threads per tile row
  static constexpr int kRowsPerPass = kThreads / kGroups;
  static constexpr int kPasses = kTile / kRowsPerPass;

  __device__ TileCombiner(const SymmetricCombine& args, T* value_low,
                          T* with_diag_low)
      : args_(args),
        value_low_(value_low),
        with_diag_low_(with_diag_low),
        col_((threadIdx.x % kGroups) * V),
        row0_(threadIdx.x / kGroups) {}

  // Registers <- this thread's part of the tile (zeros outside the matrix).
  __device__ __forceinline__ void Load(const TileIndex& t) {
    const int64_t m = args_.m;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int64_t r = t.bi * kTile + row0_ + p * kRowsPerPass;
      const int64_t c = t.bj * kTile + col_;
      const bool valid = r < m && c < m;
      const int64_t at = t.offset + r * m + c;
      if constexpr (V == 4) {
        float4 f = make_float4(0, 0, 0, 0), g = f;
        if (valid) {
          f = *reinterpret_cast<const float4*>(args_.a + at);
          if (args_.a2 != nullptr) {
            g = *reinterpret_cast<const float4*>(args_.a2 + at);
          }
        }
        a_[p][0] = f.x, a_[p][1] = f.y, a_[p][2] = f.z, a_[p][3] = f.w;
        a2_[p][0] = g.x, a2_[p][1] = g.y, a2_[p][2] = g.z, a2_[p][3] = g.w;
      } else {
        a_[p][0] = valid ? args_.a[at] : 0.0f;
        a2_[p][0] = valid && args_.a2 != nullptr ? args_.a2[at] : 0.0f;
      }
    }
  }

  // vs <- coef_a * a + coef_a2 * a2 from the registers.
  __device__ __forceinline__ void Combine(const TileIndex& t,
                                          float (*vs)[kTile + 1]) {
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int row = row0_ + p * kRowsPerPass;
      const int64_t r = t.bi * kTile + row;
      const int64_t c = t.bj * kTile + col_;
#pragma unroll
      for (int i = 0; i < V; ++i) {
        const float v = Value(p, i);
        vs[row][col_ + i] = v;
        if (args_.unhealthy != nullptr && r == c + i && r < args_.m &&
            !(a_[p][i] >= 0.0f && isfinite(a_[p][i]))) {
          atomicAdd(args_.unhealthy, 1u);
        }
      }
    }
  }

  // Whether tile t takes the fast path: off the diagonal, inside the
  // matrix, V-wide (no diagonal entry, no bounds, no unhealthy check).
  __device__ __forceinline__ bool Interior(const TileIndex& t) const {
    return V == 4 && t.bi > t.bj && (t.bi + 1) * kTile <= args_.m;
  }

  // For an interior tile: v from the registers, written to tile (bi, bj)
  // straight away and staged in vs for the mirror.
  __device__ __forceinline__ void CombineInterior(const TileIndex& t,
                                                  float (*vs)[kTile + 1]) {
    const int64_t m = args_.m;
    int64_t at = t.offset + (t.bi * kTile + row0_) * m + t.bj * kTile + col_;
#pragma unroll
    for (int p = 0; p < kPasses; ++p, at += kRowsPerPass * m) {
      const int row = row0_ + p * kRowsPerPass;
      float v[V];
#pragma unroll
      for (int i = 0; i < V; ++i) {
        v[i] = Value(p, i);
        vs[row][col_ + i] = v[i];
      }
      StoreAll(at, v, v);
    }
  }

  // For an interior tile: its mirror (bj, bi) from vs.
  __device__ __forceinline__ void StoreMirror(const TileIndex& t,
                                              const float (*vs)[kTile + 1]) {
    const int64_t m = args_.m;
    int64_t at = t.offset + (t.bj * kTile + row0_) * m + t.bi * kTile + col_;
#pragma unroll
    for (int p = 0; p < kPasses; ++p, at += kRowsPerPass * m) {
      const int row = row0_ + p * kRowsPerPass;
      float v[V];
#pragma unroll
      for (int i = 0; i < V; ++i) v[i] = vs[col_ + i][row];
      StoreAll(at, v, v, V, /*upper=*/true);
    }
  }

  // Writes tile (bi, bj) and its mirror (bj, bi) from vs.
  __device__ __forceinline__ void Store(const TileIndex& t,
                                        const float (*vs)[kTile + 1]) {
    const int64_t m = args_.m;
    for (int mirror = 0; mirror < (t.bi == t.bj ? 1 : 2); ++mirror) {
      const int64_t row_tile = mirror ? t.bj : t.bi;
      const int64_t col_tile = mirror ? t.bi : t.bj;
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int row = row0_ + p * kRowsPerPass;
        const int64_t r = row_tile * kTile + row;
        const int64_t c = col_tile * kTile + col_;
        if (r >= m || c >= m) continue;
        const int count = static_cast<int>(m - c < V ? m - c : V);
        float v[V], w[V];
#pragma unroll
        for (int i = 0; i < V; ++i) {
          const bool direct = !mirror && (t.bi > t.bj || row >= col_ + i);
          v[i] = direct ? vs[row][col_ + i] : vs[col_ + i][row];
          w[i] = r == c + i ? __fadd_rn(v[i], args_.diag) : v[i];
        }
        StoreAll(t.offset + r * m + c, v, w, count, mirror == 1);
      }
    }
  }

 private:
  // coef_a * a + coef_a2 * a2 of this thread's element (p, i).
  __device__ __forceinline__ float Value(int p, int i) const {
    float v = __fmul_rn(args_.coef_a, a_[p][i]);
    if (args_.a2 != nullptr) {
      v = __fadd_rn(v, __fmul_rn(args_.coef_a2, a2_[p][i]));
    }
    return v;
  }

  // The outputs at element `at` (count <= V of them): v, and w (v with the
  // diagonal added) for with_diag_low. value32 is not written in `upper`
  // (mirror) tiles: its users read the lower triangle only.
  __device__ __forceinline__ void StoreAll(int64_t at, const float* v,
                                           const float* w, int count = V,
                                           bool upper = false) {
    if (value_low_ != nullptr) {
      StoreRow<T, V>(value_low_, at, v, args_.value_scale, count);
    }
    if (args_.value32 != nullptr && !upper) {
      StoreRow<float, V>(args_.value32, at, v, 1.0f, count);
    }
    if (with_diag_low_ != nullptr) {
      StoreRow<T, V>(with_diag_low_, at, w, args_.with_diag_scale, count);
    }
  }

  const SymmetricCombine args_;  // a copy: no address of the kernel parameter
  T* value_low_;
  T* with_diag_low_;
  const int col_, row0_;
  float a_[kPasses][V];
  float a2_[kPasses][V];
};

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    SymmetricCombineKernel(SymmetricCombine args, T* value_low,
                           T* with_diag_low, int64_t per_matrix,
                           int64_t total) {
  __shared__ float vs[kTile][kTile + 1];
  TileCombiner<T, V> tile(args, value_low, with_diag_low);
  int64_t k = blockIdx.x;
  if (k >= total) return;
  TileIndex t = Decode(k, per_matrix, args.m);
  tile.Load(t);
  while (true) {
    __syncthreads();  // the previous tile's stores are done reading vs
    const bool interior = tile.Interior(t);
    if (interior) {
      tile.CombineInterior(t, vs);
    } else {
      tile.Combine(t, vs);
    }
    __syncthreads();
    const int64_t next = k + gridDim.x;
    const TileIndex nt = Decode(next < total ? next : k, per_matrix, args.m);
    if (next < total) tile.Load(nt);  // in flight during the stores
    if (interior) {
      tile.StoreMirror(t, vs);
    } else {
      tile.Store(t, vs);
    }
    if (next >= total) break;
    k = next;
    t = nt;
  }
}

template <typename T>
cudaError_t Combine(const SymmetricCombine& args, cudaStream_t stream) {
  const int64_t tiles = (args.m + kTile - 1) / kTile;
  const int64_t per_matrix = tiles * (tiles + 1) / 2;
  const int64_t total = per_matrix * args.count;
  // A persistent grid: as many blocks as can be resident at once (a larger
  // grid leaves a partial last wave, measured as a third of the time).
  int device = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const bool vectorized = args.m % 4 == 0 && Aligned(args.a, 16) &&
                          Aligned(args.a2, 16) && Aligned(args.value32, 16) &&
                          Aligned(args.value_low, 4 * sizeof(T)) &&
                          Aligned(args.with_diag_low, 4 * sizeof(T));
  T* value_low = static_cast<T*>(args.value_low);
  T* with_diag_low = static_cast<T*>(args.with_diag_low);
  const auto kernel =
      vectorized ? SymmetricCombineKernel<T, 4> : SymmetricCombineKernel<T, 1>;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0);
  const int64_t resident =
      static_cast<int64_t>(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
  const unsigned blocks =
      static_cast<unsigned>(total < resident ? total : resident);
  kernel<<<blocks, kThreads, 0, stream>>>(args, value_low, with_diag_low,
                                          per_matrix, total);
  return cudaGetLastError();
}

}  // namespace

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
