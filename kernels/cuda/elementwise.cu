#include "kernels/cuda/elementwise.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;

// torch.lerp's two-sided form with explicit rounding (no contraction into
// fused multiply-adds), so results equal the CPU backend's bit for bit.
__device__ __forceinline__ float Lerp(float start, float end, float weight) {
  return weight < 0.5f
             ? __fadd_rn(start, __fmul_rn(weight, __fsub_rn(end, start)))
             : __fsub_rn(end, __fmul_rn(__fsub_rn(end, start),
                                        __fsub_rn(1.0f, weight)));
}

int Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? blocks : 65535 * 16);
}

__global__ void MomentumKernel(const float* grad, float* momentum,
                               float* update, int64_t count, float mu,
                               float keep, bool nesterov) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = grad[i];
    const float buf = Lerp(momentum[i], g, keep);
    momentum[i] = buf;
    update[i] = nesterov ? Lerp(g, buf, mu) : buf;
  }
}

__global__ void ApplyKernel(float* param, const float* update, int64_t count,
                            float decay, float step) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    param[i] =
        __fadd_rn(__fmul_rn(param[i], decay), __fmul_rn(step, update[i]));
  }
}

__global__ void FindNonFiniteKernel(const float* data, int64_t count,
                                    unsigned long long* first_bad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!isfinite(data[i])) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
    }
  }
}

}  // namespace

cudaError_t LaunchMomentum(const float* grad, float* momentum, float* update,
                           int64_t count, double mu, bool nesterov,
                           cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  MomentumKernel<<<Blocks(count), kThreads, 0, stream>>>(
      grad, momentum, update, count, static_cast<float>(mu),
      static_cast<float>(1.0 - mu), nesterov);
  return cudaGetLastError();
}

cudaError_t LaunchApplyUpdate(float* param, const float* update, int64_t count,
                              float decay, float step, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  ApplyKernel<<<Blocks(count), kThreads, 0, stream>>>(param, update, count,
                                                      decay, step);
  return cudaGetLastError();
}

cudaError_t LaunchFindNonFinite(const float* data, int64_t count,
                                unsigned long long* first_bad,
                                cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  FindNonFiniteKernel<<<Blocks(count), kThreads, 0, stream>>>(data, count,
                                                              first_bad);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
