// Issues one batched Newton-Schulz orthogonalization (NS5 or Gram NS, see
// kernels/README.md) on a stream: fp32 normalization with the CPU backend's
// margin and eps, GEMMs on `low`-precision inputs with fp32 accumulation,
// symmetric products computing one triangle, the polynomial's `a` terms in
// fp32 (as the GEMM's beta on an fp32 accumulator), and the result written
// to `out` in fp32 in the input's orientation (`out` also holds the fp32
// iterate X while the iteration runs).
//
// Everything is asynchronous and capturable into a CUDA graph: no host
// synchronization, no allocation (the workspace must be prepared for the
// algorithm). Gram NS restarts at the scheduled steps of
// `options.gram_restarts`; the CPU backend's extra restart on an unhealthy
// diagonal of R would need the host to look, so the GPU only counts such
// diagonals (NsWorkspace::unhealthy) and relies on the schedule (on every
// ill-conditioned and rank-deficient test input the count stayed 0).
// Gram NS in 16-bit with the default single restart is 20-40x less
// accurate than NS5 on inputs with directions they do not span; restarts
// after steps 1, 3 and 4 bring that within 4x (ns_accuracy_gpu_test) at about
// 40% more FLOPs (see GramNs in the .cc). `options.aol` runs the opt-in AOL
// preconditioning on X X^T before the first step.
#ifndef MUONPS_KERNELS_CUDA_NS_ITERATION_H_
#define MUONPS_KERNELS_CUDA_NS_ITERATION_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/ns_workspace.h"
#include "newton_schulz/options.h"

namespace muonps {
namespace kernels {
namespace cuda {

// Power-of-two factors the GEMM-input copies are stored with, so fp16
// copies of small values stay normal numbers (all 1 for bf16 and fp32):
// the iterate X, the m x m matrices R (or A) and their polynomials, and Q.
struct NsScales {
  float x = 1.0f;
  float square = 1.0f;
  float q = 1.0f;
};
NsScales ScalesFor(cudaDataType low, int64_t m, int64_t n);

// out_i <- NS(in_i) for the workspace's stack shape. `handle` must run on
// `stream`; `out` may alias `in`.
absl::Status IssueNewtonSchulz(cublasHandle_t handle, cudaStream_t stream,
                               const float* in, float* out,
                               const NewtonSchulzOptions& options,
                               NsWorkspace* ws);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_NS_ITERATION_H_
