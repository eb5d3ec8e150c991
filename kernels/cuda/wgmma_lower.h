// Symmetric products of the GPU Newton-Schulz iteration on Hopper's tensor
// cores, with SymmetricCombine (ns_elementwise.h) fused into the epilogue.
//
// LaunchWgmmaLower computes, for each of `count` products, the 128 x 128
// tiles (bi >= bj) of p = alpha L R^T + beta C for 16-bit row-major m x k
// operands L and R (rows contiguous in k). A block computes 256 x 128 (the
// tiles (2 BI, bj) and (2 BI + 1, bj), which share their R rows): one
// producer warp group loads 128 x 64 boxes by TMA into 128-byte-swizzled
// shared memory through a ring of stages, and two consumer warp groups
// each multiply one tile (wgmma m64n128k16, fp32 accumulators); the grid is
// persistent over the blocks. The epilogue, by the same warp groups, then
// does what a combine pass over p would do, staging each output tile in
// shared memory and copying it out with bulk asynchronous copies:
//   v = coef_other * other + coef_product * p  (other null: coef_product * p)
//   product32     <- p                                 lower tiles, fp32
//   value32       <- v                                 lower tiles, fp32
//   value_low     <- value_scale * v                   both triangles
//   with_diag_low <- with_diag_scale * (v + diag * I)  both triangles
// where the upper triangle of the 16-bit outputs copies the lower one
// exactly, and `unhealthy` counts negative or non-finite diagonal entries
// of p. Within a diagonal tile the fp32 outputs' upper part is unspecified
// (consumers read lower triangles only). Each output may be null.
//
// Requirements (WgmmaLowerSupported): an sm_90 device; bf16 or fp16
// operands; m >= 128, k >= 64; m, k, the operands' leading dimensions and
// strides multiples of 8; 16-byte aligned buffers. `product32` is read for
// beta != 0 (each element by the thread that then writes it); outputs must
// not alias L, R or `other`. Launches are asynchronous on `stream` and can
// be captured into CUDA graphs. Thread-safe.
//
// Measured on an H200 (bench/results/2026-11-27-h200x1-wgmma*): the
// products alone reach 540-620 TFLOP/s against 650-710 for cuBLAS's
// 256-row tiles (ncu: tensor cores 74% busy against 99%: the epilogue is
// not overlapped with the next tile's products), and with the mirror fused
// in, more time than cuBLAS's product plus the separate combine pass; so
// SymmetricMode::kWgmma is opt-in.
#ifndef MUONPS_KERNELS_CUDA_WGMMA_LOWER_H_
#define MUONPS_KERNELS_CUDA_WGMMA_LOWER_H_

#include <cuda.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>

#include "kernels/cuda/ns_elementwise.h"

namespace muonps {
namespace kernels {
namespace cuda {

// What is done with the product p: v = coef_other * other + coef_product *
// p (other null: coef_product * p) and the outputs of v.
struct ProductTerms : SymmetricOutputs {
  const float* other = nullptr;
  float coef_other = 0.0f;
  float coef_product = 1.0f;
};

struct WgmmaLowerArgs : ProductTerms {
  cudaDataType type = CUDA_R_16BF;  // of L, R and the 16-bit outputs
  int64_t count = 0;
  int64_t m = 0;
  int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  float* product32 = nullptr;
};

// Whether the kernel runs on `device` for this operand type and shape.
bool WgmmaLowerSupported(int device, cudaDataType type, int64_t m, int64_t k);

// The TMA descriptor of a stack of `count` row-major rows x k operands of
// `type` at `data` (row r of matrix i at data + i * stride + r * ld
// elements), in the boxes the kernel loads. Host-only; no GPU work.
cudaError_t EncodeWgmmaOperand(const void* data, cudaDataType type,
                               int64_t count, int64_t rows, int64_t k,
                               int64_t ld, int64_t stride, CUtensorMap* map);

// Lets the kernel use the shared memory it needs on the current device;
// once per device before the first launch, outside any graph capture.
cudaError_t PrepareWgmmaLower();

// Queues the products and their epilogue on `stream`.
cudaError_t LaunchWgmmaLower(const CUtensorMap& l, const CUtensorMap& r,
                             const WgmmaLowerArgs& args, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_WGMMA_LOWER_H_
