// LaunchWgmmaLower (wgmma_lower.h). Compiled for sm_90a only: wgmma and
// the TMA tensor loads exist on Hopper alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <utility>

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
constexpr int kPitch = kTile + 1;  // of the staged tile, in floats

// A block computes 256 x 128 of the product: rows of L block 2 BI + wg for
// consumer warp group wg, against one 128-row block of R, so both warp
// groups share each R box (half the traffic per product of 128 x 128
// blocks alone).
// Products with 16-bit outputs stage them in `tile` (one warp group's at a
// time) and fit 3 stages beside it; the others use 4.
template <bool kStaged>
struct alignas(1024) Shared {
  static constexpr int kStages = kStaged ? 3 : 4;
  uint8_t l[kStages][2][kBoxBytes];
  uint8_t r[kStages][kBoxBytes];
  float tile[kStaged ? kTile : 1][kPitch];
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
template <bool kStaged>
constexpr size_t SharedBytes() {
  return sizeof(Shared<kStaged>) + 1024;  // + alignment slack
}

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
// Synchronizes the two consumer warp groups (256 threads).
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}
// Synchronizes the 128 threads of consumer warp group `wg` (0 or 1).
__device__ __forceinline__ void GroupSync(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 2) : "memory");
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

// The epilogue of the 128 x 128 tile (bi, bj) of warp group `wg` (d[h]:
// rows 64 h .. 64 h + 63), `active` where that tile is in the lower
// triangle: see wgmma_lower.h. With 16-bit outputs the tile is staged in
// shared memory, one warp group after the other.
template <typename T, bool kStaged>
__device__ __forceinline__ void Epilogue(const WgmmaLowerArgs& args, int matrix,
                                         int bi, int bj, bool active,
                                         float (&d)[2][kAcc], int wg, int tid,
                                         Shared<kStaged>& s) {
  const int64_t m = args.m;
  const int64_t offset = static_cast<int64_t>(matrix) * m * m;
  const int warp = tid / 32, lane = tid % 32;
  if (active) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = h * 64 + warp * 16 + lane / 4 + half * 8;
        const int64_t r = static_cast<int64_t>(bi) * kTile + row;
#pragma unroll
        for (int q = 0; q < kAcc / 4; ++q) {
          const int col = q * 8 + (lane % 4) * 2;
          const int64_t c = static_cast<int64_t>(bj) * kTile + col;
          float* slot = &d[h][4 * q + 2 * half];
          float p[2] = {args.alpha * slot[0], args.alpha * slot[1]};
          float v[2] = {0.0f, 0.0f};
          const int64_t at = offset + r * m + c;
          if (r < m && c < m) {  // c + 1 < m too: m % 8 == 0
            if (args.beta != 0.0f) {
              const float2 old =
                  *reinterpret_cast<const float2*>(args.product32 + at);
              p[0] = fmaf(args.beta, old.x, p[0]);
              p[1] = fmaf(args.beta, old.y, p[1]);
            }
            float2 o = make_float2(0.0f, 0.0f);
            if (args.other != nullptr) {
              o = *reinterpret_cast<const float2*>(args.other + at);
            }
            const float other[2] = {o.x, o.y};
#pragma unroll
            for (int i = 0; i < 2; ++i) {
              v[i] = __fmul_rn(args.coef_product, p[i]);
              if (args.other != nullptr) {
                v[i] = __fadd_rn(__fmul_rn(args.coef_other, other[i]), v[i]);
              }
              if (args.unhealthy != nullptr && r == c + i &&
                  !(p[i] >= 0.0f && isfinite(p[i]))) {
                atomicAdd(args.unhealthy, 1u);
              }
            }
            if (args.product32 != nullptr) {
              *reinterpret_cast<float2*>(args.product32 + at) =
                  make_float2(p[0], p[1]);
            }
            if (args.value32 != nullptr) {
              *reinterpret_cast<float2*>(args.value32 + at) =
                  make_float2(v[0], v[1]);
            }
          }
          slot[0] = v[0];  // kept for the 16-bit outputs
          slot[1] = v[1];
        }
      }
    }
  }
  if constexpr (!kStaged) return;
  T* value_low = static_cast<T*>(args.value_low);
  T* with_diag_low = static_cast<T*>(args.with_diag_low);
  for (int turn = 0; turn < 2; ++turn) {
    ConsumerSync();  // the previous user of s.tile is done with it
    if (turn != wg || !active) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = h * 64 + warp * 16 + lane / 4 + half * 8;
#pragma unroll
        for (int q = 0; q < kAcc / 4; ++q) {
          const int col = q * 8 + (lane % 4) * 2;
          s.tile[row][col] = d[h][4 * q + 2 * half];
          s.tile[row][col + 1] = d[h][4 * q + 2 * half + 1];
        }
      }
    }
    GroupSync(wg);
    // Both triangles from the staged tile: 32 threads per row, 4 columns
    // each, 4 rows per pass.
    const int col = lane * 4;
    for (int mirror = 0; mirror < (bi == bj ? 1 : 2); ++mirror) {
      const int64_t row_tile = mirror ? bj : bi;
      const int64_t col_tile = mirror ? bi : bj;
#pragma unroll 4
      for (int pass = 0; pass < kTile / 4; ++pass) {
        const int row = warp + pass * 4;
        const int64_t r = row_tile * kTile + row;
        const int64_t c = col_tile * kTile + col;
        if (r >= m || c >= m) continue;  // c + 3 < m too: m % 8 == 0
        float v[4], w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bool direct = !mirror && (bi > bj || row >= col + i);
          v[i] = direct ? s.tile[row][col + i] : s.tile[col + i][row];
          w[i] = r == c + i ? __fadd_rn(v[i], args.diag) : v[i];
        }
        const int64_t at = offset + r * m + c;
        if (value_low != nullptr) {
          Store4<T>(value_low + at, v, args.value_scale);
        }
        if (with_diag_low != nullptr) {
          Store4<T>(with_diag_low + at, w, args.with_diag_scale);
        }
      }
    }
  }
}

// Persistent over the blocks of 256 x 128; both consumer warp groups work
// on the same block (rows 128 wg .. 128 wg + 127 of it).
template <typename T, bool kStaged>
__global__ void __launch_bounds__(kThreads, 1)
    WgmmaLowerKernel(const __grid_constant__ CUtensorMap lmap,
                     const __grid_constant__ CUtensorMap rmap,
                     const WgmmaLowerArgs args) {
  extern __shared__ uint8_t raw[];
  using Smem = Shared<kStaged>;
  constexpr int kStages = Smem::kStages;
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(raw) + 1023) &
                                     ~uintptr_t{1023});
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
    Epilogue<T, kStaged>(args, x.matrix, bi, x.bj, bi >= x.bj && bi < cols, d,
                         wg, tid, s);
  }
}

template <typename T>
cudaError_t Launch(const CUtensorMap& l, const CUtensorMap& r,
                   const WgmmaLowerArgs& args, cudaStream_t stream) {
  const bool staged =
      args.value_low != nullptr || args.with_diag_low != nullptr;
  const auto kernel =
      staged ? WgmmaLowerKernel<T, true> : WgmmaLowerKernel<T, false>;
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
  kernel<<<blocks, kThreads,
           staged ? SharedBytes<true>() : SharedBytes<false>(), stream>>>(l, r,
                                                                          args);
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
  const std::pair<const void*, size_t> kernels[] = {
      {reinterpret_cast<const void*>(WgmmaLowerKernel<__nv_bfloat16, true>),
       SharedBytes<true>()},
      {reinterpret_cast<const void*>(WgmmaLowerKernel<__nv_bfloat16, false>),
       SharedBytes<false>()},
      {reinterpret_cast<const void*>(WgmmaLowerKernel<__half, true>),
       SharedBytes<true>()},
      {reinterpret_cast<const void*>(WgmmaLowerKernel<__half, false>),
       SharedBytes<false>()}};
  for (const auto& [kernel, bytes] : kernels) {
    const cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(bytes));
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
