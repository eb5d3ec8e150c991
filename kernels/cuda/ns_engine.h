// Runs batched Newton-Schulz on the GPU for the CUDA backend: keeps one
// NsWorkspace per stack shape and, with graphs on, one captured CUDA graph
// per (shape, buffers, options), so a steady-state call is one graph
// launch with no allocation and no host synchronization.
//
// Workspaces are never freed before the engine (a worker's shapes are
// fixed per plan); at most kMaxGraphs graphs are kept. Not thread-safe.
#ifndef MUONPS_KERNELS_CUDA_NS_ENGINE_H_
#define MUONPS_KERNELS_CUDA_NS_ENGINE_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/ns_workspace.h"
#include "kernels/cuda/symmetric_gemm.h"
#include "kernels/newton_schulz_options.h"

namespace muonps {
namespace kernels {
namespace cuda {

class NsEngine {
 public:
  static constexpr size_t kMaxGraphs = 64;

  // `handle` must already run on `stream` with a workspace set (graph
  // capture needs one); both stay owned by the caller and must outlive the
  // engine.
  NsEngine(cublasHandle_t handle, cudaStream_t stream, cudaDataType low,
           const SymmetricPlan& plan, bool use_graphs);
  NsEngine(const NsEngine&) = delete;
  NsEngine& operator=(const NsEngine&) = delete;
  ~NsEngine();

  // Queues out_i <- NS(in_i) for `count` rows x cols fp32 device matrices on
  // the stream and returns (asynchronous). `out` may alias `in`; `options`
  // must be valid. Errors name the failing CUDA or cuBLAS call.
  absl::Status Run(const float* in, float* out, int64_t count, int64_t rows,
                   int64_t cols, const NewtonSchulzOptions& options);

  // Negative or non-finite diagonal entries of R seen by the last Gram run
  // on this shape (0 when the scheduled restarts kept R healthy).
  // Synchronizes the stream; NOT_FOUND if the shape never ran.
  absl::StatusOr<unsigned int> DriftCount(int64_t count, int64_t rows,
                                          int64_t cols);

 private:
  using ShapeKey = std::tuple<int64_t, int64_t, int64_t>;
  absl::StatusOr<NsWorkspace*> Workspace(int64_t count, int64_t rows,
                                         int64_t cols, NsAlgorithm algorithm);
  absl::Status Capture(const float* in, float* out,
                       const NewtonSchulzOptions& options, NsWorkspace* ws,
                       cudaGraphExec_t* exec);

  cublasHandle_t handle_;
  cudaStream_t stream_;
  cudaDataType low_;
  SymmetricPlan plan_;
  bool use_graphs_;
  std::map<ShapeKey, std::unique_ptr<NsWorkspace>> workspaces_;
  std::map<std::string, cudaGraphExec_t> graphs_;
};

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CUDA_NS_ENGINE_H_
