// Runs batched Newton-Schulz on the GPU for the CUDA backend: keeps one
// NsWorkspace per stack shape and, with graphs on, one captured CUDA graph
// per (shape, buffers, options), so a steady-state call is one graph
// launch with no allocation and no host synchronization.
//
// With two lanes (cuBLAS handle + stream each), a stack of two or more
// matrices is split into halves that run as two independent chains, so the
// memory-bound kernels of one overlap the GEMMs of the other; the work is
// forked from and joined back into the first lane's stream.
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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/ns_workspace.h"
#include "kernels/cuda/symmetric_gemm.h"
#include "kernels/newton_schulz_options.h"

namespace muonps {
namespace kernels {
namespace cuda {

// A cuBLAS handle already set to run on `stream`, with its own workspace
// (graph capture needs one, and concurrent lanes must not share it).
struct NsLane {
  cublasHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
};

class NsEngine {
 public:
  static constexpr size_t kMaxGraphs = 64;

  // One or two lanes; handles and streams stay owned by the caller and must
  // outlive the engine. Work is queued on lanes[0].stream.
  NsEngine(std::vector<NsLane> lanes, cudaDataType low,
           const SymmetricPlan& plan, bool use_graphs);
  NsEngine(cublasHandle_t handle, cudaStream_t stream, cudaDataType low,
           const SymmetricPlan& plan, bool use_graphs)
      : NsEngine({NsLane{handle, stream}}, low, plan, use_graphs) {}
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
  // (count, rows, cols, lane).
  using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int>;
  // One chain per lane: the lane's share of the stack and its workspace.
  struct Chain {
    int lane;
    int64_t first;
    NsWorkspace* ws;
  };
  absl::StatusOr<std::vector<Chain>> Prepare(int64_t count, int64_t rows,
                                             int64_t cols,
                                             NsAlgorithm algorithm);
  absl::Status Issue(const float* in, float* out, int64_t rows, int64_t cols,
                     const NewtonSchulzOptions& options,
                     const std::vector<Chain>& chains);
  absl::Status Capture(const float* in, float* out, int64_t rows, int64_t cols,
                       const NewtonSchulzOptions& options,
                       const std::vector<Chain>& chains, cudaGraphExec_t* exec);

  std::vector<NsLane> lanes_;
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_ = nullptr;
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
