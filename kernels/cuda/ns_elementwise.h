// Elementwise and reduction kernels of the GPU Newton-Schulz iteration: the
// fp32 Frobenius normalization, fp32-to-GEMM-input casts, and the combine
// kernel that mirrors a lower triangle into a full symmetric matrix while
// forming the NS polynomial in fp32.
//
// "Low" buffers hold GEMM inputs in `low_type` (CUDA_R_32F, CUDA_R_16BF or
// CUDA_R_16F), stored multiplied by a power-of-two `scale` that keeps fp16
// values out of its subnormal range (1 for the other types). All pointers
// are device pointers; launches are asynchronous on `stream`, never
// synchronize the host, can be captured into CUDA graphs, and return the
// launch error. Thread-safe.
#ifndef MUONPS_KERNELS_CUDA_NS_ELEMENTWISE_H_
#define MUONPS_KERNELS_CUDA_NS_ELEMENTWISE_H_

#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>

namespace muonps {
namespace kernels {
namespace cuda {

// sums[i] <- sum of squares (in double) of matrix i of the `count` matrices
// of `elements` floats each stored back to back at x.
cudaError_t LaunchSumOfSquares(const float* x, int64_t count, int64_t elements,
                               double* sums, cudaStream_t stream);

// With denom_i = max(margin * sqrt(sums[i]), eps), as the CPU backend does:
// out32 <- x / denom_i (fp32, by the fp32 reciprocal when it is a normal
// number, else by a double division), and out_low <- low_scale * out32 in
// low_type. Either output may be null; out32 may alias x.
cudaError_t LaunchNormalize(const float* x, int64_t count, int64_t elements,
                            const double* sums, double margin, double eps,
                            float* out32, void* out_low, cudaDataType low_type,
                            float low_scale, cudaStream_t stream);

// out_low[i] <- low_scale * x[i] in low_type, for `total` elements.
cudaError_t LaunchCast(const float* x, int64_t total, void* out_low,
                       cudaDataType low_type, float low_scale,
                       cudaStream_t stream);

// out[i] <- pseudo-random values in [-scale, scale) (a hash of i and
// `seed`) in `type`, for `total` elements: operands for timing GEMMs whose
// speed depends on their data (a power-limited GPU clocks zeros faster).
cudaError_t LaunchFillRandom(void* out, int64_t total, cudaDataType type,
                             uint32_t seed, float scale, cudaStream_t stream);

// The outputs of a symmetric combine's values v (each may be null):
//   value_low     <- value_scale * v                  (low_type)
//   value32       <- v on its lower triangle (fp32; SymmetricCombine's
//                    tiles above the diagonal are left as they were)
//   with_diag_low <- with_diag_scale * (v + diag * I) (low_type)
// and `unhealthy`, which counts bad diagonal entries (see each user). Shared
// by SymmetricCombine and the fused products of symmetric_gemm.h.
struct SymmetricOutputs {
  void* value_low = nullptr;
  float value_scale = 1.0f;
  float* value32 = nullptr;
  void* with_diag_low = nullptr;
  float diag = 0.0f;
  float with_diag_scale = 1.0f;
  unsigned int* unhealthy = nullptr;
};

// For `count` row-major m x m symmetric matrices of which only the lower
// triangle (row >= col) of `a` and `a2` is valid: v = coef_a * a +
// coef_a2 * a2 (a2 may be null), mirrored to the full matrix, into the
// outputs. Outputs must not alias inputs, except value32, which may be `a`
// itself (each element is read before it is written, by the same block).
// When `unhealthy` is set, every negative or non-finite diagonal entry of
// `a` adds 1 to it.
struct SymmetricCombine : SymmetricOutputs {
  const float* a = nullptr;
  const float* a2 = nullptr;
  float coef_a = 1.0f;
  float coef_a2 = 0.0f;
  int64_t count = 0;
  int64_t m = 0;
  cudaDataType low_type = CUDA_R_32F;
};
cudaError_t LaunchSymmetricCombine(const SymmetricCombine& args,
                                   cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_NS_ELEMENTWISE_H_
