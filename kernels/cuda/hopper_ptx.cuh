// The Hopper (sm_90a) instructions of the wgmma kernel (wgmma_lower.cu), as
// device functions: shared-memory barriers (mbarrier), TMA tensor loads,
// wgmma descriptors and products, named barriers of a warp group, and bulk
// asynchronous copies to global memory. Each wraps one PTX instruction or
// a short fixed sequence; none allocates. For .cu files compiled for
// sm_90a only.
#ifndef MUONPS_KERNELS_CUDA_HOPPER_PTX_CUH_
#define MUONPS_KERNELS_CUDA_HOPPER_PTX_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace muonps {
namespace kernels {
namespace cuda {
namespace hopper {

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

// Stores four 8 x 8 matrices of 16-bit values from a warp's fragments
// (thread t holds row t / 4, columns 2 (t % 4) and + 1 of each, packed in
// r[j] for matrix j) to shared memory, row i of matrix j at the address
// that thread 8 j + i passes; kTranspose stores each matrix transposed.
template <bool kTranspose>
__device__ __forceinline__ void StoreMatrices(uint32_t address,
                                              const uint32_t (&r)[4]) {
  if (kTranspose) {
    asm volatile(
        "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], "
        "{%1, %2, %3, %4};\n" ::"r"(address),
        "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
        : "memory");
  } else {
    asm volatile(
        "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], "
        "{%1, %2, %3, %4};\n" ::"r"(address),
        "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
        : "memory");
  }
}

// Two floats rounded to nearest as a packed pair of T (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t Pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t Pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t Pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// d += A B^T for the warp group's 64 x 16 A and 128 x 16 B in shared memory
// (64 fp32 accumulators per thread).
template <typename T>
__device__ __forceinline__ void Mma(float (&d)[64], uint64_t a, uint64_t b);

// One specialization per 16-bit type: only the instruction's type suffix
// differs.
#define MUONPS_HOPPER_MMA(T, SUFFIX)                                       \
  template <>                                                              \
  __device__ __forceinline__ void Mma<T>(float(&d)[64], uint64_t a,        \
                                         uint64_t b) {                     \
    asm volatile(                                                          \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." SUFFIX "." SUFFIX   \
        " "                                                                \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "              \
        "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "     \
        "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "     \
        "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "     \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "     \
        "%60, %61, %62, %63}, "                                            \
        "%64, %65, 1, 1, 1, 0, 0;\n"                                       \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),      \
          "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),      \
          "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
          "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
          "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), \
          "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), \
          "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
          "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])               \
        : "l"(a), "l"(b));                                                 \
  }

MUONPS_HOPPER_MMA(__nv_bfloat16, "bf16")
MUONPS_HOPPER_MMA(__half, "f16")
#undef MUONPS_HOPPER_MMA

}  // namespace hopper
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_HOPPER_PTX_CUH_
