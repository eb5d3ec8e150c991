// The epilogue of the wgmma kernel (wgmma_lower.cu): from a consumer warp
// group's accumulators of one 128 x 128 lower tile, the outputs of
// WgmmaLowerArgs (p, the combine's v, their fp32 tiles and both triangles'
// 16-bit tiles), each staged in the warp group's shared-memory buffer and
// copied out row by row with bulk asynchronous copies. Device code for
// sm_90a; the warp group's 128 threads call each function together.
#ifndef MUONPS_KERNELS_CUDA_WGMMA_EPILOGUE_CUH_
#define MUONPS_KERNELS_CUDA_WGMMA_EPILOGUE_CUH_

#include <cstdint>

#include "kernels/cuda/hopper_ptx.cuh"
#include "kernels/cuda/low_precision.cuh"
#include "kernels/cuda/wgmma_lower.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace hopper {

constexpr int kTile = 128;  // what a warp group computes: 128 x 128
constexpr int kAcc = 64;    // fp32 accumulators per 64 x 128 half
// One round stages 64 fp32 rows or 128 16-bit rows, rows padded to keep
// 16-byte alignment.
constexpr int kPitch32 = kTile + 4;  // floats
constexpr int kPitch16 = kTile + 8;  // 16-bit elements
constexpr int kStagingBytes = 128 * kPitch16 * 2;
static_assert(64 * kPitch32 * 4 <= kStagingBytes, "fp32 rounds fit");

// One warp group's staging buffer: a round writes it, publishes it and has
// the first warp copy its rows out; the next round first waits until those
// copies have read it.
class Stager {
 public:
  __device__ Stager(uint8_t* buffer, int wg, int tid)
      : buffer_(buffer), wg_(wg), tid_(tid) {}

  __device__ __forceinline__ void Acquire() {
    if (tid_ < 32) BulkWaitRead();
    GroupSync(wg_);
  }
  // Rows [0, rows) of `pitch` bytes each, `bytes` of them to
  // global + row * global_pitch (bytes); rows at or past `valid_rows` and
  // nothing at all when bytes == 0 are skipped.
  __device__ __forceinline__ void Release(int rows, int valid_rows,
                                          uint32_t pitch, uint32_t bytes,
                                          char* global, int64_t global_pitch) {
    FenceAsyncProxy();
    GroupSync(wg_);
    if (tid_ < 32) {
      for (int row = tid_; row < rows && row < valid_rows && bytes > 0;
           row += 32) {
        BulkStore(global + row * global_pitch, buffer_ + row * pitch, bytes);
      }
      BulkCommit();
    }
  }
  __device__ __forceinline__ void Finish() {
    if (tid_ < 32) BulkWaitAll();
  }
  __device__ __forceinline__ float* f32() const {
    return reinterpret_cast<float*>(buffer_);
  }
  template <typename T>
  __device__ __forceinline__ T* low() const {
    return reinterpret_cast<T*>(buffer_);
  }

 private:
  uint8_t* buffer_;
  int wg_, tid_;
};

// Where a warp group's accumulator pair (d[h][4 q + 2 half], + 1) lies in
// its 128 x 128 tile.
struct Fragment {
  int warp, lane;
  __device__ __forceinline__ int Row(int h, int half) const {
    return h * 64 + warp * 16 + lane / 4 + half * 8;
  }
  __device__ __forceinline__ int Col(int q) const {
    return q * 8 + (lane % 4) * 2;
  }
};

// fp32 tile (bi, bj) of `out` from d (as it holds it now), in two rounds of
// 64 rows.
__device__ __forceinline__ void StoreFp32(Stager& st, const Fragment& f,
                                          const float (&d)[2][kAcc], float* out,
                                          int64_t m, int64_t bi, int64_t bj) {
  const int64_t r0 = bi * kTile, c0 = bj * kTile;
  const uint32_t bytes =
      static_cast<uint32_t>((c0 + kTile <= m ? kTile : m - c0) * 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.Acquire();
    float* tile = st.f32();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = f.Row(0, half);  // within these 64 rows
#pragma unroll
      for (int q = 0; q < kAcc / 4; ++q) {
        const int col = f.Col(q);
        *reinterpret_cast<float2*>(tile + row * kPitch32 + col) =
            make_float2(d[h][4 * q + 2 * half], d[h][4 * q + 2 * half + 1]);
      }
    }
    const int64_t first = r0 + h * 64;
    st.Release(64, static_cast<int>(m - first < 64 ? m - first : 64),
               kPitch32 * 4, bytes,
               reinterpret_cast<char*>(out + first * m + c0), m * 4);
  }
}

// Both triangles' 16-bit tiles from d's values v (the lower tile (bi, bj)):
// scale * (v + diag on the diagonal) to (bi, bj) and, off the diagonal, its
// transpose to (bj, bi); a diagonal tile's upper part copies its lower one.
template <typename T>
__device__ __forceinline__ void StoreLow(Stager& st, const Fragment& f,
                                         const float (&d)[2][kAcc], T* out,
                                         float scale, float diag, int64_t m,
                                         int64_t bi, int64_t bj) {
#pragma unroll
  for (int mirror = 0; mirror < 2; ++mirror) {
    if (mirror && bi == bj) break;
    st.Acquire();
    T* tile = st.low<T>();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = f.Row(h, half);
#pragma unroll
        for (int q = 0; q < kAcc / 4; ++q) {
          const int col = f.Col(q);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float v = d[h][4 * q + 2 * half + i];
            if (bi == bj && row == col + i) v = __fadd_rn(v, diag);
            const T x = FromFloat<T>(v * scale);
            if (bi != bj) {
              if (mirror) {
                tile[(col + i) * kPitch16 + row] = x;
              } else {
                tile[row * kPitch16 + col + i] = x;
              }
            } else if (row >= col + i) {
              tile[row * kPitch16 + col + i] = x;
              tile[(col + i) * kPitch16 + row] = x;
            }
          }
        }
      }
    }
    const int64_t row_tile = mirror ? bj : bi;
    const int64_t col_tile = mirror ? bi : bj;
    const int64_t r0 = row_tile * kTile, c0 = col_tile * kTile;
    const uint32_t bytes =
        static_cast<uint32_t>((c0 + kTile <= m ? kTile : m - c0) * sizeof(T));
    st.Release(kTile, static_cast<int>(m - r0 < kTile ? m - r0 : kTile),
               kPitch16 * sizeof(T), bytes,
               reinterpret_cast<char*>(out + r0 * m + c0),
               m * static_cast<int64_t>(sizeof(T)));
  }
}

// The epilogue of the 128 x 128 tile (bi, bj) of a warp group (d[h]: rows
// 64 h .. 64 h + 63), for a tile in the lower triangle: see wgmma_lower.h.
template <typename T>
__device__ __forceinline__ void Epilogue(const WgmmaLowerArgs& args, int matrix,
                                         int bi, int bj, float (&d)[2][kAcc],
                                         const Fragment& f, Stager& st) {
  const int64_t m = args.m;
  const int64_t offset = static_cast<int64_t>(matrix) * m * m;
  // p = alpha acc + beta C, in place.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = static_cast<int64_t>(bi) * kTile + f.Row(h, half);
#pragma unroll
      for (int q = 0; q < kAcc / 4; ++q) {
        const int64_t c = static_cast<int64_t>(bj) * kTile + f.Col(q);
        float* slot = &d[h][4 * q + 2 * half];
        slot[0] *= args.alpha;
        slot[1] *= args.alpha;
        if (r >= m || c >= m) continue;  // c + 1 < m too: m % 8 == 0
        if (args.beta != 0.0f) {
          const float2 old = *reinterpret_cast<const float2*>(
              args.product32 + offset + r * m + c);
          slot[0] = fmaf(args.beta, old.x, slot[0]);
          slot[1] = fmaf(args.beta, old.y, slot[1]);
        }
        if (args.unhealthy != nullptr) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            if (r == c + i && !(slot[i] >= 0.0f && isfinite(slot[i]))) {
              atomicAdd(args.unhealthy, 1u);
            }
          }
        }
      }
    }
  }
  if (args.product32 != nullptr) {
    StoreFp32(st, f, d, args.product32 + offset, m, bi, bj);
  }
  if (args.value32 == nullptr && args.value_low == nullptr &&
      args.with_diag_low == nullptr) {
    return;
  }
  // v = coef_other other + coef_product p, in place.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t r = static_cast<int64_t>(bi) * kTile + f.Row(h, half);
#pragma unroll
      for (int q = 0; q < kAcc / 4; ++q) {
        const int64_t c = static_cast<int64_t>(bj) * kTile + f.Col(q);
        float* slot = &d[h][4 * q + 2 * half];
        float2 o = make_float2(0.0f, 0.0f);
        if (args.other != nullptr && r < m && c < m) {
          o = *reinterpret_cast<const float2*>(args.other + offset + r * m + c);
        }
        const float other[2] = {o.x, o.y};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          slot[i] = __fmul_rn(args.coef_product, slot[i]);
          if (args.other != nullptr) {
            slot[i] = __fadd_rn(__fmul_rn(args.coef_other, other[i]), slot[i]);
          }
        }
      }
    }
  }
  if (args.value32 != nullptr) {
    StoreFp32(st, f, d, args.value32 + offset, m, bi, bj);
  }
  if (args.value_low != nullptr) {
    StoreLow<T>(st, f, d, static_cast<T*>(args.value_low) + offset,
                args.value_scale, 0.0f, m, bi, bj);
  }
  if (args.with_diag_low != nullptr) {
    StoreLow<T>(st, f, d, static_cast<T*>(args.with_diag_low) + offset,
                args.with_diag_scale, args.diag, m, bi, bj);
  }
}

}  // namespace hopper
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_WGMMA_EPILOGUE_CUH_
