// LaunchWgmmaLower (wgmma_lower.h). Compiled for sm_90a only: wgmma and
// the TMA tensor loads exist on Hopper alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/low_precision.cuh"
#include "kernels/cuda/wgmma_lower.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

constexpr int kTile = 128;     // what a warp group computes: 128 x 128
constexpr int kBk = 64;        // k per stage: one 128-byte swizzle row
constexpr int kThreads = 384;  // producer + two consumer warp groups
constexpr int kAcc = 64;       // fp32 accumulators per 64 x 128 half
constexpr int kBoxBytes = kTile * kBk * 2;

// A block computes 256 x 128 of the product: rows of L block 2 BI + wg for
// consumer warp group wg, against one 128-row block of R, so both warp
// groups share each R box (half the traffic per product of 128 x 128
// blocks alone).
constexpr int kStages = 3;
// The epilogue stages each output in shared memory, one round at a time,
// and copies it out by bulk asynchronous copies (row by row), which drain
// while the next tile's products run: 64 fp32 rows or 128 16-bit rows per
// round, rows padded to keep 16-byte alignment.
constexpr int kPitch32 = kTile + 4;  // floats
constexpr int kPitch16 = kTile + 8;  // 16-bit elements
constexpr int kStagingBytes = 128 * kPitch16 * 2;
static_assert(64 * kPitch32 * 4 <= kStagingBytes, "fp32 rounds fit");

struct alignas(1024) Shared {
  uint8_t l[kStages][2][kBoxBytes];
  uint8_t r[kStages][kBoxBytes];
  alignas(16) uint8_t staging[2][kStagingBytes];  // one per warp group
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
constexpr size_t kSharedBytes = sizeof(Shared) + 1024;  // + alignment slack

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void BarrierInit(uint64_t* bar, unsigned count) {
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(bar)),
      "r"(count));
}

__device__ __forceinline__ bool BarrierTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
  const uint32_t address = SharedAddress(bar);
  while (!BarrierTryWait(address, parity)) {
  }
}

__device__ __forceinline__ void BarrierArrive(uint64_t* bar) {
  asm volatile(
      "mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SharedAddress(bar))
      : "memory");
}

__device__ __forceinline__ void BarrierExpectBytes(uint64_t* bar,
                                                   uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   SharedAddress(bar)),
               "r"(bytes)
               : "memory");
}

// TMA: the box at (k0, row0, matrix) of `map` into `dst`, counted on `bar`.
__device__ __forceinline__ void LoadBox(const CUtensorMap* map, void* dst,
                                        uint64_t* bar, int k0, int row0,
                                        int matrix) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::"
      "complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          SharedAddress(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(k0), "r"(row0), "r"(matrix),
      "r"(SharedAddress(bar))
      : "memory");
}

// wgmma descriptor of a K-major operand in 128-byte-swizzled rows: 8-row
// groups 1024 bytes apart (the leading offset is unused in this mode).
__device__ __forceinline__ uint64_t Descriptor(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) |
         (static_cast<uint64_t>(1) << 62);
}

__device__ __forceinline__ void MmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void MmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void MmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending)
               : "memory");
}
// Synchronizes the 128 threads of consumer warp group `wg` (0 or 1).
__device__ __forceinline__ void GroupSync(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 2) : "memory");
}

// Bulk asynchronous copy of `bytes` from shared to global memory, in this
// thread's current bulk group.
__device__ __forceinline__ void BulkStore(void* global, const void* shared,
                                          uint32_t bytes) {
  asm volatile(
      "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
          global),
      "r"(SharedAddress(shared)), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void BulkCommit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// This thread's bulk copies have read their shared memory.
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk copies are complete.
__device__ __forceinline__ void BulkWaitAll() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
// Makes this thread's shared-memory writes visible to bulk copies.
__device__ __forceinline__ void FenceAsyncProxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// d += A B^T for the warp group's 64 x 16 A and 128 x 16 B in shared memory.
template <typename T>
__device__ __forceinline__ void Mma(float (&d)[kAcc], uint64_t a, uint64_t b);

template <>
__device__ __forceinline__ void Mma<__nv_bfloat16>(float (&d)[kAcc], uint64_t a,
                                                   uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
      "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
      "%58, %59, %60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]),
        "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
        "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),
        "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
        "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b));
}

template <>
__device__ __forceinline__ void Mma<__half>(float (&d)[kAcc], uint64_t a,
                                            uint64_t b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
      "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, "
      "%58, %59, %60, %61, %62, %63}, "
      "%64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]),
        "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
        "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),
        "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
        "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b));
}

// Block (BI, bj): rows [256 BI, 256 BI + 256) of the product, columns
// [128 bj, 128 bj + 128), for bj <= 2 BI + 1 (and bj < blocks of 128): row
// BI holds 2 BI + 2 blocks, so rows before BI hold BI (BI + 1).
struct TileIndex {
  int matrix;
  int big_row, bj;
};

__device__ __forceinline__ TileIndex Decode(int64_t t, int64_t per_matrix) {
  TileIndex x;
  x.matrix = static_cast<int>(t / per_matrix);
  const int64_t local = t - x.matrix * per_matrix;
  int64_t row = static_cast<int64_t>((sqrt(4.0 * local + 1) - 1) / 2);
  while (row * (row + 1) > local) --row;
  while ((row + 1) * (row + 2) <= local) ++row;
  x.big_row = static_cast<int>(row);
  x.bj = static_cast<int>(local - row * (row + 1));
  return x;
}

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

// Persistent over the blocks of 256 x 128; both consumer warp groups work
// on the same block (rows 128 wg .. 128 wg + 127 of it).
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    WgmmaLowerKernel(const __grid_constant__ CUtensorMap lmap,
                     const __grid_constant__ CUtensorMap rmap,
                     const WgmmaLowerArgs args) {
  extern __shared__ uint8_t raw[];
  Shared& s = *reinterpret_cast<Shared*>(
      (reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
  const int64_t cols = (args.m + kTile - 1) / kTile;
  const int64_t rows = (cols + 1) / 2;
  const int64_t per_matrix =
      (rows - 1) * rows + (2 * rows < cols ? 2 * rows : cols);
  const int64_t total = per_matrix * args.count;
  const int k_steps = static_cast<int>((args.k + kBk - 1) / kBk);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      BarrierInit(&s.full[i], 1);
      BarrierInit(&s.empty[i], 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int group = threadIdx.x / 128;
  int stage = 0;
  uint32_t phase = 0;
  if (group == 0) {
    // The producer needs few registers; the consumers get them.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x != 0) return;
    for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
      const TileIndex x = Decode(t, per_matrix);
      for (int ks = 0; ks < k_steps; ++ks) {
        BarrierWait(&s.empty[stage], phase ^ 1);
        BarrierExpectBytes(&s.full[stage], 3 * kBoxBytes);
        for (int h = 0; h < 2; ++h) {
          LoadBox(&lmap, s.l[stage][h], &s.full[stage], ks * kBk,
                  (2 * x.big_row + h) * kTile, x.matrix);
        }
        LoadBox(&rmap, s.r[stage], &s.full[stage], ks * kBk, x.bj * kTile,
                x.matrix);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int wg = group - 1;
  const int tid = threadIdx.x % 128;
  const Fragment fragment{tid / 32, tid % 32};
  Stager stager(s.staging[wg], wg, tid);
  float d[2][kAcc];
  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const TileIndex x = Decode(t, per_matrix);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) d[h][i] = 0.0f;
    }
    // One group of products stays in flight: a stage is released once the
    // group after it has been issued.
    int previous = -1;
    for (int ks = 0; ks < k_steps; ++ks) {
      BarrierWait(&s.full[stage], phase);
      MmaFence();
      const uint32_t a = SharedAddress(s.l[stage][wg]);
      const uint32_t b = SharedAddress(s.r[stage]);
#pragma unroll
      for (int kk = 0; kk < kBk / 16; ++kk) {
        const uint64_t bd = Descriptor(b + kk * 32);
        Mma<T>(d[0], Descriptor(a + kk * 32), bd);
        Mma<T>(d[1], Descriptor(a + 64 * 128 + kk * 32), bd);
      }
      MmaCommit();
      MmaWait<1>();
      if (previous >= 0 && tid == 0) BarrierArrive(&s.empty[previous]);
      previous = stage;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }
    MmaWait<0>();
    if (tid == 0) BarrierArrive(&s.empty[previous]);
    const int bi = 2 * x.big_row + wg;
    if (bi >= x.bj && bi < cols) {  // this warp group's tile is a lower one
      Epilogue<T>(args, x.matrix, bi, x.bj, d, fragment, stager);
    }
  }
  stager.Finish();
}

template <typename T>
cudaError_t Launch(const CUtensorMap& l, const CUtensorMap& r,
                   const WgmmaLowerArgs& args, cudaStream_t stream) {
  const auto kernel = WgmmaLowerKernel<T>;
  cudaError_t e = cudaSuccess;
  int device = 0, sms = 0;
  if ((e = cudaGetDevice(&device)) != cudaSuccess) return e;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount,
                                  device)) != cudaSuccess) {
    return e;
  }
  const int64_t cols = (args.m + kTile - 1) / kTile;
  const int64_t rows = (cols + 1) / 2;
  const int64_t total =
      ((rows - 1) * rows + std::min(2 * rows, cols)) * args.count;
  const unsigned blocks =
      static_cast<unsigned>(total < sms ? total : static_cast<int64_t>(sms));
  kernel<<<blocks, kThreads, kSharedBytes, stream>>>(l, r, args);
  return cudaGetLastError();
}

}  // namespace

bool WgmmaLowerSupported(int device, cudaDataType type, int64_t m, int64_t k) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                             device) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0 &&
         (type == CUDA_R_16BF || type == CUDA_R_16F) && m >= kTile &&
         k >= kBk && m % 8 == 0 && k % 8 == 0;
}

cudaError_t PrepareWgmmaLower() {
  for (const auto kernel :
       {WgmmaLowerKernel<__nv_bfloat16>, WgmmaLowerKernel<__half>}) {
    const cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(kSharedBytes));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t EncodeWgmmaOperand(const void* data, cudaDataType type,
                               int64_t count, int64_t rows, int64_t k,
                               int64_t ld, int64_t stride, CUtensorMap* map) {
  if (type != CUDA_R_16BF && type != CUDA_R_16F) return cudaErrorInvalidValue;
  if (ld % 8 != 0 || stride % 8 != 0 || k % 8 != 0 ||
      reinterpret_cast<uintptr_t>(data) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found;
  cudaError_t e = cudaGetDriverEntryPointByVersion(
      "cuTensorMapEncodeTiled", &entry, 12000, cudaEnableDefault, &found);
  if (e != cudaSuccess) return e;
  if (found != cudaDriverEntryPointSuccess || entry == nullptr) {
    return cudaErrorNotSupported;
  }
  using Encode =
      CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(k),
                              static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(count)};
  // Byte strides of dimensions 1 and 2 (a single matrix still needs one).
  const cuuint64_t strides[2] = {
      static_cast<cuuint64_t>(ld) * 2,
      static_cast<cuuint64_t>(count > 1 ? stride : rows * ld) * 2};
  const cuuint32_t box[3] = {kBk, kTile, 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r = reinterpret_cast<Encode>(entry)(
      map,
      type == CUDA_R_16BF ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                          : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      3, const_cast<void*>(data), dims, strides, box, unit,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t LaunchWgmmaLower(const CUtensorMap& l, const CUtensorMap& r,
                             const WgmmaLowerArgs& args, cudaStream_t stream) {
  if (args.count <= 0 || args.m <= 0) return cudaSuccess;
  if (args.beta != 0.0f && args.product32 == nullptr) {
    return cudaErrorInvalidValue;
  }
  switch (args.type) {
    case CUDA_R_16BF:
      return Launch<__nv_bfloat16>(l, r, args, stream);
    case CUDA_R_16F:
      return Launch<__half>(l, r, args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
