// Fused elementwise kernels of a Muon/AdamW step on the GPU, launched on an
// explicit stream. The arithmetic matches the CPU backend operation for
// operation (torch.lerp's two-sided form, the same fp32 rounding order), so
// the two agree bit for bit on the same inputs.
//
// All pointers are device pointers; launches are asynchronous on `stream`
// and return the launch error (cudaSuccess if queued). Thread-safe.
#ifndef MUONPS_KERNELS_CUDA_ELEMENTWISE_H_
#define MUONPS_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace muonps {
namespace kernels {
namespace cuda {

// momentum <- lerp(momentum, grad, 1 - mu), with 1 - mu rounded to fp32
// from double as the CPU backend does;
// update <- nesterov ? lerp(grad, momentum, mu) : momentum.
cudaError_t LaunchMomentum(const float* grad, float* momentum, float* update,
                           int64_t count, double mu, bool nesterov,
                           cudaStream_t stream);

// param <- param * decay + step * update (step = -adjusted lr).
cudaError_t LaunchApplyUpdate(float* param, const float* update, int64_t count,
                              float decay, float step, cudaStream_t stream);

// *first_bad <- min(*first_bad, index of any non-finite element). The caller
// sets *first_bad to INT64_MAX before the launch.
cudaError_t LaunchFindNonFinite(const float* data, int64_t count,
                                unsigned long long* first_bad,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_ELEMENTWISE_H_
