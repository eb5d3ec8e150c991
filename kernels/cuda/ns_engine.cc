#include "kernels/cuda/ns_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ns_iteration.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

// Everything a captured graph bakes in: shape, buffers and options.
std::string GraphKey(const float* in, const float* out, int64_t count,
                     int64_t rows, int64_t cols, const NewtonSchulzOptions& o) {
  return absl::StrCat(
      count, "x", rows, "x", cols, " ", reinterpret_cast<uintptr_t>(in), ">",
      reinterpret_cast<uintptr_t>(out), " ", NsAlgorithmName(o.algorithm), " ",
      o.steps, " ", o.coefficients.a, ",", o.coefficients.b, ",",
      o.coefficients.c, " ", o.polar_express, " ", o.eps, " [",
      absl::StrJoin(o.gram_restarts, ","), "]");
}

}  // namespace

NsEngine::NsEngine(cublasHandle_t handle, cudaStream_t stream, cudaDataType low,
                   const SymmetricPlan& plan, bool use_graphs)
    : handle_(handle),
      stream_(stream),
      low_(low),
      plan_(plan),
      use_graphs_(use_graphs) {}

NsEngine::~NsEngine() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
}

absl::StatusOr<NsWorkspace*> NsEngine::Workspace(int64_t count, int64_t rows,
                                                 int64_t cols,
                                                 NsAlgorithm algorithm) {
  std::unique_ptr<NsWorkspace>& ws = workspaces_[{count, rows, cols}];
  if (ws == nullptr) {
    ws = std::make_unique<NsWorkspace>(count, rows, cols, low_, plan_);
  }
  MUONPS_RETURN_IF_ERROR(ws->Prepare(algorithm));
  return ws.get();
}

absl::Status NsEngine::Capture(const float* in, float* out,
                               const NewtonSchulzOptions& options,
                               NsWorkspace* ws, cudaGraphExec_t* exec) {
  MUONPS_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const absl::Status issued =
      IssueNewtonSchulz(handle_, stream_, in, out, options, ws);
  cudaGraph_t graph = nullptr;
  // End the capture whatever happened, so the stream is usable again.
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (!issued.ok() || ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    MUONPS_RETURN_IF_ERROR(issued);
    return CudaStatus(ended, "cudaStreamEndCapture (Newton-Schulz graph)");
  }
  const cudaError_t made = cudaGraphInstantiate(exec, graph, 0);
  cudaGraphDestroy(graph);
  return CudaStatus(made, "cudaGraphInstantiate (Newton-Schulz graph)");
}

absl::Status NsEngine::Run(const float* in, float* out, int64_t count,
                           int64_t rows, int64_t cols,
                           const NewtonSchulzOptions& options) {
  MUONPS_ASSIGN_OR_RETURN(NsWorkspace * ws,
                          Workspace(count, rows, cols, options.algorithm));
  if (!use_graphs_) {
    return IssueNewtonSchulz(handle_, stream_, in, out, options, ws);
  }
  const std::string key = GraphKey(in, out, count, rows, cols, options);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) {
      // Graph launches already queued keep their own copy of the work.
      cudaGraphExecDestroy(graphs_.begin()->second);
      graphs_.erase(graphs_.begin());
    }
    cudaGraphExec_t exec = nullptr;
    MUONPS_RETURN_IF_ERROR(Capture(in, out, options, ws, &exec));
    it = graphs_.emplace(key, exec).first;
  }
  return CudaStatus(cudaGraphLaunch(it->second, stream_),
                    "cudaGraphLaunch (Newton-Schulz graph)");
}

absl::StatusOr<unsigned int> NsEngine::DriftCount(int64_t count, int64_t rows,
                                                  int64_t cols) {
  const auto it = workspaces_.find({count, rows, cols});
  if (it == workspaces_.end()) {
    return absl::NotFoundError(absl::StrCat("no Newton-Schulz run on shape ",
                                            count, "x", rows, "x", cols));
  }
  unsigned int drift = 0;
  MUONPS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&drift, it->second->unhealthy(),
                                              sizeof(drift),
                                              cudaMemcpyDeviceToHost, stream_));
  MUONPS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return drift;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
