// Runs batched Newton-Schulz on the GPU for the CUDA backend: keeps one
// NsWorkspace per stack shape and, with graphs on, one captured CUDA graph
// per (shape, buffers, options), so a steady-state call is one graph
// launch with no allocation and no host synchronization.
//
// Streams: each Run names the stream it is ordered on and returns once its
// work is enqueued there. Graphs are captured on a stream of the engine's
// own (never the caller's) and launched on the call's stream, so a graph
// replays on any stream. The first lane's cuBLAS handle is bound to the
// call's stream (and its workspace set again: cublasSetStream resets it)
// before uncaptured work is issued.
//
// With two lanes (cuBLAS handle + stream each), a stack of two or more
// matrices is split into halves that run as two independent chains, so the
// memory-bound kernels of one overlap the GEMMs of the other; the work is
// forked from and joined back into the call's stream (the first lane runs
// on the call's stream, the second on its own).
//
// Workspaces, tile pointers and the lanes' cuBLAS workspaces are shared by
// every call, whatever its stream: a Run on a stream other than the
// previous Run's first makes its stream wait for all the work the engine
// queued before (one event, recorded at the end of every Run), so calls on
// different streams are ordered in call order, never concurrent.
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
#include "newton_schulz/options.h"

namespace muonps {
namespace kernels {
namespace cuda {

// A cuBLAS handle with its own workspace (graph capture needs one, and
// concurrent lanes must not share it). The engine sets the handle's stream
// and workspace itself before issuing work on it.
struct NsLane {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Lanes after the first: the stream they run on (forked from and joined
  // into the call's stream). Ignored for the first lane, which runs on the
  // stream each Run names.
  cudaStream_t stream = nullptr;
};

class NsEngine {
 public:
  static constexpr size_t kMaxGraphs = 64;

  // One or two lanes; handles, workspaces and streams stay owned by the
  // caller and must outlive the engine. Runs on the current CUDA device.
  NsEngine(std::vector<NsLane> lanes, cudaDataType low,
           const SymmetricPlan& plan, bool use_graphs);
  NsEngine(const NsEngine&) = delete;
  NsEngine& operator=(const NsEngine&) = delete;
  // Waits for the work the engine queued, then frees its graphs and
  // streams.
  ~NsEngine();

  // Queues out_i <- NS(in_i) for `count` rows x cols fp32 device matrices on
  // `stream` (a CUDA stream of the engine's device, not the legacy default
  // stream) and returns. `out` may alias `in`; `options` must be valid; the
  // buffers must stay valid until the stream reaches the work. Errors name
  // the failing CUDA or cuBLAS call.
  absl::Status Run(const float* in, float* out, int64_t count, int64_t rows,
                   int64_t cols, const NewtonSchulzOptions& options,
                   cudaStream_t stream);

  // Negative or non-finite diagonal entries of R seen by the last Gram run
  // on this shape (0 when the scheduled restarts kept R healthy). Waits for
  // the work the engine queued; NOT_FOUND if the shape never ran.
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
  // Makes `stream` wait for the previous Run when that ran on another one.
  absl::Status OrderAfterPrevious(cudaStream_t stream);
  // Points lane `lane`'s handle at `stream` and at the lane's workspace.
  absl::Status BindLane(int lane, cudaStream_t stream);
  // Issues the chains with the first lane on `main`.
  absl::Status Issue(const float* in, float* out, int64_t rows, int64_t cols,
                     const NewtonSchulzOptions& options,
                     const std::vector<Chain>& chains, cudaStream_t main);
  // Run's work on `stream`: a graph launch (captured on first use) or, with
  // graphs off, the issued kernels.
  absl::Status Enqueue(const float* in, float* out, int64_t count, int64_t rows,
                       int64_t cols, const NewtonSchulzOptions& options,
                       cudaStream_t stream);
  // Captures Issue on capture_ into a graph.
  absl::Status Capture(const float* in, float* out, int64_t rows, int64_t cols,
                       const NewtonSchulzOptions& options,
                       const std::vector<Chain>& chains, cudaGraphExec_t* exec);

  std::vector<NsLane> lanes_;
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_ = nullptr;
  cudaStream_t capture_ = nullptr;  // created on first capture
  // Recorded at the end of every Run on its stream (created on first Run).
  cudaEvent_t done_ = nullptr;
  cudaStream_t last_stream_ = nullptr;  // the previous Run's, or null
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
