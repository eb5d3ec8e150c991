// Kernels of the opt-in AOL preconditioning (NewtonSchulzOptions::aol) on
// the GPU: per-row scales s_i = 1 / (margin * sqrt(sum_j |A_ij|)) from the
// full symmetric A = X X^T, and the rescaling X <- S X, A <- S A S, so the
// first Newton-Schulz step reuses A.
//
// All pointers are device pointers; launches are asynchronous on `stream`,
// never synchronize the host, can be captured into CUDA graphs, and return
// the launch error. Thread-safe.
#ifndef MUONPS_KERNELS_CUDA_AOL_SCALING_H_
#define MUONPS_KERNELS_CUDA_AOL_SCALING_H_

#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>

namespace muonps {
namespace kernels {
namespace cuda {

// scales[i * m + r] <- 1 / (margin * sqrt(sum_j |a_low[i][r][j]| /
// low_scale)) for the `count` full row-major m x m matrices of `a_low`
// (stored times low_scale in low_type); 1 where the row sum is zero or not
// finite (a zero row of X stays zero).
cudaError_t LaunchAolScales(const void* a_low, cudaDataType low_type,
                            float low_scale, int64_t count, int64_t m,
                            double margin, float* scales, cudaStream_t stream);

// Row r of the wide m x n matrix i times scales[i * m + r]: in x32 (fp32)
// and, from it, x_low <- low_scale * x32 (low_type; may be null). The stack
// is stored row-major (row_major) or as its column-major transpose.
cudaError_t LaunchScaleRows(float* x32, void* x_low, cudaDataType low_type,
                            float low_scale, int64_t count, int64_t m,
                            int64_t n, bool row_major, const float* scales,
                            cudaStream_t stream);

// a[i][r][c] *= scales[i * m + r] * scales[i * m + c] for `count`
// row-major fp32 m x m matrices.
cudaError_t LaunchScaleSymmetric(float* a, int64_t count, int64_t m,
                                 const float* scales, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_AOL_SCALING_H_
