// Micro-benchmarks behind ns_gpu_timing: the rates of the cuBLAS GEMMs and
// own kernels the Newton-Schulz engine is made of, on Llama-3-8B shapes, to
// tell GEMM efficiency from elementwise overhead (and how much cuBLASLt's
// other algorithms would gain). Developer tool; prints JSON lines.
#ifndef MUONPS_KERNELS_CUDA_MICRO_BENCHMARKS_H_
#define MUONPS_KERNELS_CUDA_MICRO_BENCHMARKS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace muonps {
namespace kernels {
namespace cuda {

// Times the elementwise kernels and, with `gemms`, the cuBLAS GEMMs and
// cuBLASLt's alternatives. Returns false on any CUDA or cuBLAS error.
bool RunMicroBenchmarks(cublasHandle_t handle, cudaStream_t stream, bool gemms);

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_MICRO_BENCHMARKS_H_
