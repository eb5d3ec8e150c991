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
  // All 128 threads' shared-memory writes are visible to each other.
  __device__ __forceinline__ void Sync() const { GroupSync(wg_); }
  __device__ __forceinline__ int tid() const { return tid_; }
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

// Calls fn(slot, row, col) for each of the thread's accumulator pairs
// (slot = &d[h][4 q + 2 half], slot[0] and slot[1]) with the pair's row
// and first column within the 128 x 128 tile.
template <typename Fn>
__device__ __forceinline__ void ForEachPair(const Fragment& f,
                                            float (&d)[2][kAcc], Fn&& fn) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = f.Row(h, half);
#pragma unroll
      for (int q = 0; q < kAcc / 4; ++q) {
        fn(&d[h][4 * q + 2 * half], row, f.Col(q));
      }
    }
  }
}

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

// Stages scale * (v + diag on the diagonal) of d's 128 x 128 tile in 16
// bits (`diag` 0 off the diagonal tiles), transposed when kTranspose, with
// one stmatrix per 16 x 16 block of a warp's fragments.
template <typename T, bool kTranspose>
__device__ __forceinline__ void StageLow(T* tile, const Fragment& f,
                                         const float (&d)[2][kAcc], float scale,
                                         float diag) {
  // This thread addresses row i of matrix j of each stmatrix.
  const int j = f.lane / 8, i = f.lane % 8;
  const uint32_t base = SharedAddress(tile);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r0 = h * 64 + f.warp * 16;  // the warp's rows r0 .. r0 + 15
#pragma unroll
    for (int qp = 0; qp < kAcc / 8; ++qp) {
      // Matrix jj: rows r0 + 8 (jj % 2) .., columns 16 qp + 8 (jj / 2) ..
      uint32_t packed[4];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int q = 2 * qp + jj / 2, half = jj % 2;
        float lo = d[h][4 * q + 2 * half], hi = d[h][4 * q + 2 * half + 1];
        if (diag != 0.0f) {
          const int row = f.Row(h, half), col = f.Col(q);
          if (row == col) lo = __fadd_rn(lo, diag);
          if (row == col + 1) hi = __fadd_rn(hi, diag);
        }
        packed[jj] = Pack2<T>(lo * scale, hi * scale);
      }
      const int row =
          kTranspose ? 16 * qp + 8 * (j / 2) + i : r0 + 8 * (j % 2) + i;
      const int col = kTranspose ? r0 + 8 * (j % 2) : 16 * qp + 8 * (j / 2);
      StoreMatrices<kTranspose>(
          base + static_cast<uint32_t>((row * kPitch16 + col) * sizeof(T)),
          packed);
    }
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
  const auto release = [&](int64_t row_tile, int64_t col_tile) {
    const int64_t r0 = row_tile * kTile, c0 = col_tile * kTile;
    const uint32_t bytes =
        static_cast<uint32_t>((c0 + kTile <= m ? kTile : m - c0) * sizeof(T));
    st.Release(kTile, static_cast<int>(m - r0 < kTile ? m - r0 : kTile),
               kPitch16 * sizeof(T), bytes,
               reinterpret_cast<char*>(out + r0 * m + c0),
               m * static_cast<int64_t>(sizeof(T)));
  };
  const bool diagonal = bi == bj;
  st.Acquire();
  T* tile = st.low<T>();
  StageLow<T, false>(tile, f, d, scale, diagonal ? diag : 0.0f);
  if (diagonal) {
    // Row `tid` of the upper part from column `tid` of the lower.
    st.Sync();
    const int r = st.tid();
    for (int c = r + 1; c < kTile; ++c) {
      tile[r * kPitch16 + c] = tile[c * kPitch16 + r];
    }
  }
  release(bi, bj);
  if (diagonal) return;
  st.Acquire();
  StageLow<T, true>(st.low<T>(), f, d, scale, 0.0f);
  release(bj, bi);
}

// The epilogue of the 128 x 128 tile (bi, bj) of a warp group (d[h]: rows
// 64 h .. 64 h + 63), for a tile in the lower triangle: see wgmma_lower.h.
template <typename T, bool kLow>
__device__ __forceinline__ void Epilogue(const WgmmaLowerArgs& args, int matrix,
                                         int bi, int bj, float (&d)[2][kAcc],
                                         const Fragment& f, Stager& st) {
  const int64_t m = args.m;
  const int64_t offset = static_cast<int64_t>(matrix) * m * m;
  // Within the tile: rows and columns inside the matrix, and where the
  // tile starts in an m x m fp32 matrix (m < 2^24, so row * m fits int).
  const int ld = static_cast<int>(m);
  const int rows_in = static_cast<int>(m - int64_t{bi} * kTile);
  const int cols_in = static_cast<int>(m - int64_t{bj} * kTile);
  const int64_t origin = offset + (int64_t{bi} * m + bj) * kTile;
  // p = alpha acc + beta C, in place.
  const float* c_tile = args.beta != 0.0f ? args.product32 + origin : nullptr;
  const bool check = bi == bj && args.unhealthy != nullptr;
  ForEachPair(f, d, [&](float* slot, int row, int col) {
    slot[0] *= args.alpha;
    slot[1] *= args.alpha;
    if (row >= rows_in || col >= cols_in) return;  // col + 1 too: m % 8 == 0
    if (c_tile != nullptr) {
      const float2 old =
          *reinterpret_cast<const float2*>(c_tile + row * ld + col);
      slot[0] = fmaf(args.beta, old.x, slot[0]);
      slot[1] = fmaf(args.beta, old.y, slot[1]);
    }
    if (check) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (row == col + i && !(slot[i] >= 0.0f && isfinite(slot[i]))) {
          atomicAdd(args.unhealthy, 1u);
        }
      }
    }
  });
  if (args.product32 != nullptr) {
    StoreFp32(st, f, d, args.product32 + offset, m, bi, bj);
  }
  if (args.value32 == nullptr && args.value_low == nullptr &&
      args.with_diag_low == nullptr) {
    return;
  }
  // v = coef_other other + coef_product p, in place.
  const float* other_tile =
      args.other != nullptr ? args.other + origin : nullptr;
  ForEachPair(f, d, [&](float* slot, int row, int col) {
    slot[0] = __fmul_rn(args.coef_product, slot[0]);
    slot[1] = __fmul_rn(args.coef_product, slot[1]);
    if (other_tile == nullptr) return;
    float2 o = make_float2(0.0f, 0.0f);
    if (row < rows_in && col < cols_in) {
      o = *reinterpret_cast<const float2*>(other_tile + row * ld + col);
    }
    slot[0] = __fadd_rn(__fmul_rn(args.coef_other, o.x), slot[0]);
    slot[1] = __fadd_rn(__fmul_rn(args.coef_other, o.y), slot[1]);
  });
  if (args.value32 != nullptr) {
    StoreFp32(st, f, d, args.value32 + offset, m, bi, bj);
  }
  if (!kLow) return;
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
