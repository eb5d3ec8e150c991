#include "kernels/cuda/ns_engine.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cuda_status.h"
#include "common/status.h"
#include "kernels/cuda/cublas_status.h"
#include "kernels/cuda/ns_iteration.h"

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

// Everything a captured graph bakes in: shape, buffers and options.
std::string GraphKey(const float* in, const float* out, int64_t count,
                     int64_t rows, int64_t cols, const NewtonSchulzOptions& o) {
  // Doubles in hex-float form: exact, so different values never collide.
  return absl::StrFormat("%dx%dx%d %p>%p %s %d %a,%a,%a %d %a [%s]", count,
                         rows, cols, in, out, NsAlgorithmName(o.algorithm),
                         o.steps, o.coefficients.a, o.coefficients.b,
                         o.coefficients.c, o.polar_express ? 1 : 0, o.eps,
                         absl::StrJoin(o.gram_restarts, ","));
}

}  // namespace

NsEngine::NsEngine(std::vector<NsLane> lanes, cudaDataType low,
                   const SymmetricPlan& plan, bool use_graphs)
    : lanes_(std::move(lanes)),
      low_(low),
      plan_(plan),
      use_graphs_(use_graphs) {}

NsEngine::~NsEngine() {
  // The workspaces are freed next: let the queued work finish with them.
  if (done_ != nullptr) cudaEventSynchronize(done_);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  if (fork_ != nullptr) cudaEventDestroy(fork_);
  if (join_ != nullptr) cudaEventDestroy(join_);
  if (done_ != nullptr) cudaEventDestroy(done_);
  if (capture_ != nullptr) cudaStreamDestroy(capture_);
}

absl::Status NsEngine::OrderAfterPrevious(cudaStream_t stream) {
  if (stream == nullptr) {
    return InvalidField("stream",
                        "Newton-Schulz runs on a CUDA stream of the device, "
                        "not the legacy default stream (null)");
  }
  if (done_ == nullptr) {
    MUONPS_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  // The previous Run recorded done_ at its end, so waiting for it never
  // touches that stream (which its owner may have destroyed since).
  if (last_stream_ != nullptr && last_stream_ != stream) {
    MUONPS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, done_, 0));
  }
  last_stream_ = stream;
  return absl::OkStatus();
}

absl::Status NsEngine::BindLane(int lane, cudaStream_t stream) {
  const NsLane& l = lanes_[lane];
  MUONPS_CUBLAS_RETURN_IF_ERROR(cublasSetStream(l.handle, stream));
  // cublasSetStream resets the workspace to cuBLAS's default pool, which
  // allocates on first use and so cannot be captured.
  MUONPS_CUBLAS_RETURN_IF_ERROR(
      cublasSetWorkspace(l.handle, l.workspace, l.workspace_bytes));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<NsEngine::Chain>> NsEngine::Prepare(
    int64_t count, int64_t rows, int64_t cols, NsAlgorithm algorithm) {
  const int lanes = count >= 2 && lanes_.size() >= 2 ? 2 : 1;
  if (lanes == 2 && fork_ == nullptr) {
    MUONPS_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    MUONPS_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  }
  std::vector<Chain> chains;
  int64_t first = 0;
  for (int lane = 0; lane < lanes; ++lane) {
    const int64_t share =
        lane == 0 ? (count + lanes - 1) / lanes : count - first;
    std::unique_ptr<NsWorkspace>& ws =
        workspaces_[ShapeKey{share, rows, cols, lane}];
    if (ws == nullptr) {
      ws = std::make_unique<NsWorkspace>(share, rows, cols, low_, plan_);
    }
    MUONPS_RETURN_IF_ERROR(ws->Prepare(algorithm));
    chains.push_back({lane, first, ws.get()});
    first += share;
  }
  return chains;
}

absl::Status NsEngine::Issue(const float* in, float* out, int64_t rows,
                             int64_t cols, const NewtonSchulzOptions& options,
                             const std::vector<Chain>& chains,
                             cudaStream_t main) {
  for (const Chain& chain : chains) {
    MUONPS_RETURN_IF_ERROR(BindLane(
        chain.lane, chain.lane == 0 ? main : lanes_[chain.lane].stream));
  }
  if (chains.size() > 1) {
    MUONPS_CUDA_RETURN_IF_ERROR(cudaEventRecord(fork_, main));
    for (size_t i = 1; i < chains.size(); ++i) {
      MUONPS_CUDA_RETURN_IF_ERROR(
          cudaStreamWaitEvent(lanes_[chains[i].lane].stream, fork_, 0));
    }
  }
  for (const Chain& chain : chains) {
    const NsLane& lane = lanes_[chain.lane];
    const int64_t offset = chain.first * rows * cols;
    MUONPS_RETURN_IF_ERROR(
        IssueNewtonSchulz(lane.handle, chain.lane == 0 ? main : lane.stream,
                          in + offset, out + offset, options, chain.ws));
  }
  for (size_t i = 1; i < chains.size(); ++i) {
    MUONPS_CUDA_RETURN_IF_ERROR(
        cudaEventRecord(join_, lanes_[chains[i].lane].stream));
    MUONPS_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(main, join_, 0));
  }
  return absl::OkStatus();
}

absl::Status NsEngine::Capture(const float* in, float* out, int64_t rows,
                               int64_t cols, const NewtonSchulzOptions& options,
                               const std::vector<Chain>& chains,
                               cudaGraphExec_t* exec) {
  if (capture_ == nullptr) {
    MUONPS_CUDA_RETURN_IF_ERROR(
        cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking));
  }
  // Captured work is recorded, not run: the graph holds no stream, and its
  // launch on the call's stream orders it there.
  MUONPS_CUDA_RETURN_IF_ERROR(
      cudaStreamBeginCapture(capture_, cudaStreamCaptureModeThreadLocal));
  const absl::Status issued =
      Issue(in, out, rows, cols, options, chains, capture_);
  cudaGraph_t graph = nullptr;
  // End the capture whatever happened, so the streams are usable again.
  const cudaError_t ended = cudaStreamEndCapture(capture_, &graph);
  if (!issued.ok() || ended != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    MUONPS_RETURN_IF_ERROR(issued);
    return CudaStatus(ended, "cudaStreamEndCapture (Newton-Schulz graph)");
  }
  const cudaError_t made = cudaGraphInstantiate(exec, graph, 0);
  cudaGraphDestroy(graph);
  return CudaStatus(made, "cudaGraphInstantiate (Newton-Schulz graph)");
}

absl::Status NsEngine::Enqueue(const float* in, float* out, int64_t count,
                               int64_t rows, int64_t cols,
                               const NewtonSchulzOptions& options,
                               cudaStream_t stream) {
  MUONPS_ASSIGN_OR_RETURN(const std::vector<Chain> chains,
                          Prepare(count, rows, cols, options.algorithm));
  if (!use_graphs_) {
    return Issue(in, out, rows, cols, options, chains, stream);
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
    MUONPS_RETURN_IF_ERROR(
        Capture(in, out, rows, cols, options, chains, &exec));
    it = graphs_.emplace(key, exec).first;
  }
  return CudaStatus(cudaGraphLaunch(it->second, stream),
                    "cudaGraphLaunch (Newton-Schulz graph)");
}

absl::Status NsEngine::Run(const float* in, float* out, int64_t count,
                           int64_t rows, int64_t cols,
                           const NewtonSchulzOptions& options,
                           cudaStream_t stream) {
  MUONPS_RETURN_IF_ERROR(OrderAfterPrevious(stream));
  const absl::Status queued =
      Enqueue(in, out, count, rows, cols, options, stream);
  // Recorded even after a failure: whatever part was queued is covered.
  const cudaError_t recorded = cudaEventRecord(done_, stream);
  MUONPS_RETURN_IF_ERROR(queued);
  return CudaStatus(recorded, "cudaEventRecord (end of Newton-Schulz)");
}

absl::StatusOr<unsigned int> NsEngine::DriftCount(int64_t count, int64_t rows,
                                                  int64_t cols) {
  if (done_ != nullptr) {
    MUONPS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_));
  }
  unsigned int total = 0;
  bool found = false;
  for (const auto& [key, ws] : workspaces_) {
    if (std::get<1>(key) != rows || std::get<2>(key) != cols) continue;
    const int lanes = count >= 2 && lanes_.size() >= 2 ? 2 : 1;
    const int64_t first_share = (count + lanes - 1) / lanes;
    const int lane = std::get<3>(key);
    if (lane >= lanes ||
        std::get<0>(key) != (lane == 0 ? first_share : count - first_share)) {
      continue;
    }
    unsigned int drift = 0;
    // The engine's work is done (above): a plain copy reads the counter.
    MUONPS_CUDA_RETURN_IF_ERROR(cudaMemcpy(
        &drift, ws->unhealthy(), sizeof(drift), cudaMemcpyDeviceToHost));
    total += drift;
    found = true;
  }
  if (!found) {
    return absl::NotFoundError(absl::StrCat("no Newton-Schulz run on shape ",
                                            count, "x", rows, "x", cols));
  }
  return total;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace muonps
