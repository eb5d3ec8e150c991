// LaunchWgmmaLower (wgmma_lower.h). Compiled for sm_90a only: wgmma and
// the TMA tensor loads exist on Hopper alone.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "kernels/cuda/hopper_ptx.cuh"
#include "kernels/cuda/wgmma_epilogue.cuh"
#include "kernels/cuda/wgmma_lower.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace hopper {

constexpr int kBk = 64;        // k per stage: one 128-byte swizzle row
constexpr int kThreads = 384;  // producer + two consumer warp groups
constexpr int kBoxBytes = kTile * kBk * 2;

// A block computes 256 x 128 of the product: rows of L block 2 BI + wg for
// consumer warp group wg, against one 128-row block of R, so both warp
// groups share each R box (half the traffic per product of 128 x 128
// blocks alone).
constexpr int kStages = 3;

struct alignas(1024) Shared {
  uint8_t l[kStages][2][kBoxBytes];
  uint8_t r[kStages][kBoxBytes];
  alignas(16) uint8_t staging[2][kStagingBytes];  // one per warp group
  uint64_t full[kStages];
  uint64_t empty[kStages];
};
constexpr size_t kSharedBytes = sizeof(Shared) + 1024;  // + alignment slack

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

// Persistent over the blocks of 256 x 128; both consumer warp groups work
// on the same block (rows 128 wg .. 128 wg + 127 of it). kLow: whether the
// epilogue writes 16-bit outputs (the kernel without them needs fewer
// registers).
template <typename T, bool kLow>
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
      Epilogue<T, kLow>(args, x.matrix, bi, x.bj, d, fragment, stager);
    }
  }
  stager.Finish();
}

template <typename T>
cudaError_t Launch(const CUtensorMap& l, const CUtensorMap& r,
                   const WgmmaLowerArgs& args, cudaStream_t stream) {
  const bool low = args.value_low != nullptr || args.with_diag_low != nullptr;
  const auto kernel =
      low ? WgmmaLowerKernel<T, true> : WgmmaLowerKernel<T, false>;
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

}  // namespace hopper

bool WgmmaLowerSupported(int device, cudaDataType type, int64_t m, int64_t k) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                             device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                             device) != cudaSuccess) {
    return false;
  }
  return major == 9 && minor == 0 &&
         (type == CUDA_R_16BF || type == CUDA_R_16F) && m >= hopper::kTile &&
         k >= hopper::kBk && m % 8 == 0 && k % 8 == 0;
}

cudaError_t PrepareWgmmaLower() {
  for (const auto kernel : {hopper::WgmmaLowerKernel<__nv_bfloat16, false>,
                            hopper::WgmmaLowerKernel<__nv_bfloat16, true>,
                            hopper::WgmmaLowerKernel<__half, false>,
                            hopper::WgmmaLowerKernel<__half, true>}) {
    const cudaError_t e = cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(hopper::kSharedBytes));
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
  const cuuint32_t box[3] = {hopper::kBk, hopper::kTile, 1};
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
      return hopper::Launch<__nv_bfloat16>(l, r, args, stream);
    case CUDA_R_16F:
      return hopper::Launch<__half>(l, r, args, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
