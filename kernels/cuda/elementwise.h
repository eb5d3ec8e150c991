// Fused elementwise kernels of a Muon/AdamW step on the GPU, launched on an
// explicit stream. The arithmetic matches the CPU backend operation for
// operation (torch.lerp's two-sided form, the same fp32 rounding order), so
// the two agree bit for bit on the same inputs.
//
// All pointers are device pointers; launches are asynchronous on `stream`
// and return the launch error (cudaSuccess if queued). Thread-safe.
//
// `first_bad` guards: a kernel given a non-null `first_bad` (the result of
// LaunchFindNonFinite) writes nothing when it holds an index, i.e. a value
// below INT64_MAX, so a step rejected on the device leaves state untouched
// without a host synchronization.
#ifndef MUONPS_KERNELS_CUDA_ELEMENTWISE_H_
#define MUONPS_KERNELS_CUDA_ELEMENTWISE_H_

#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>

namespace muonps {
namespace kernels {
namespace cuda {

// momentum <- lerp(previous, grad, 1 - mu), with 1 - mu rounded to fp32
// from double as the CPU backend does (previous may be momentum itself);
// update <- nesterov ? lerp(grad, momentum, mu) : momentum.
cudaError_t LaunchMomentum(const float* grad, const float* previous,
                           float* momentum, float* update, int64_t count,
                           double mu, bool nesterov, cudaStream_t stream,
                           const unsigned long long* first_bad = nullptr);

// param <- param * decay + step * update (step = -adjusted lr), computed in
// fp32 from the widened elements in that order and rounded once to the
// parameter's type (nearest even). Types: CUDA_R_32F, CUDA_R_16BF and
// CUDA_R_16F (cudaErrorInvalidValue for another).
cudaError_t LaunchApplyUpdate(void* param, cudaDataType param_type,
                              const void* update, cudaDataType update_type,
                              int64_t count, float decay, float step,
                              cudaStream_t stream,
                              const unsigned long long* first_bad = nullptr);
// dst <- src converted (widened, or rounded to nearest even), `count`
// elements; types as above.
cudaError_t LaunchConvert(const void* src, cudaDataType src_type, void* dst,
                          cudaDataType dst_type, int64_t count,
                          cudaStream_t stream);
// data <- data * factor (fp32, rounded to nearest as on the CPU).
cudaError_t LaunchScale(float* data, int64_t count, float factor,
                        cudaStream_t stream);

// One torch.optim.AdamW step over `count` elements, operation for operation
// as the CPU backend: param *= decay; exp_avg <- lerp(exp_avg, grad, keep1);
// exp_avg_sq <- exp_avg_sq * beta2 + keep2 * grad^2;
// param -= step_size * exp_avg / (sqrt(exp_avg_sq) / bias2_sqrt + eps).
struct AdamWScalars {
  float decay;
  float keep1;
  float beta2;
  float keep2;
  float step_size;
  float bias2_sqrt;
  float eps;
};
cudaError_t LaunchAdamW(float* param, const float* grad, float* exp_avg,
                        float* exp_avg_sq, int64_t count,
                        const AdamWScalars& scalars, cudaStream_t stream,
                        const unsigned long long* first_bad = nullptr);

// *first_bad <- min(*first_bad, index of any non-finite element). The caller
// sets *first_bad to INT64_MAX (or any larger value, such as all bits set)
// before the launch.
cudaError_t LaunchFindNonFinite(const float* data, int64_t count,
                                unsigned long long* first_bad,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_ELEMENTWISE_H_
