// step_gpu_bench: a trainer lending 1.74 B fp32 parameters shaped as 8
// layers of Llama-3-8B (per layer q, k, v, o, gate, up, down) to the
// muonps-worker on its GPU by CUDA IPC, through real coordinator and worker
// processes (run.sh starts them), stepping random gradients. Prints JSON
// lines (what, ms, ratios against the peers torch_peers.py measured in the
// same run on the same GPU):
//   muonps_ns_all       momentum + Newton-Schulz of the whole set with the
//                       plan's algorithms, batched by shape, in this process
//   muonps_step_1gpu    one trainer + one worker: from the Step call until
//                       the trainer's stream sees the parameters updated
//   muonps_step_1gpu_clock  each measured step's Step call, return and
//                       parameters seen, in ms on the steady clock (the
//                       worker's timeline lines say when each round began
//                       on it: began_at_ms)
//   muonps_step_return  how long Step blocks the trainer's host thread
//   muonps_step_1gpu_2workers  (--worker_sockets A,B) two trainers and two
//                       workers sharing the GPU over CUDA IPC peer copies
// With --ranks N > 1 it is trainer --rank r of N on GPU r instead, in a
// --layout (ranks_step.h): muonps_step_<N>gpu and, per worker,
// muonps_bytes_sent_per_step.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/ns_gpu/peer_results.h"
#include "bench/step_gpu/llama_matrices.h"
#include "bench/step_gpu/ranks_step.h"
#include "bench/step_gpu/two_trainers_step.h"
#include "client/client.h"
#include "common/cuda_status.h"
#include "common/logging.h"
#include "common/statistics.h"
#include "common/status.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_name.h"
#include "kernels/cuda/precision.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "Coordinator address.");
ABSL_FLAG(std::string, worker_socket, "", "The worker's Unix socket.");
ABSL_FLAG(std::string, job, "step-gpu", "Job name.");
ABSL_FLAG(std::string, torch_results, "", "torch_peers.py's JSON lines.");
ABSL_FLAG(std::string, worker_sockets, "",
          "Two workers' sockets: the two-trainer, two-worker run instead.");
ABSL_FLAG(std::string, one_worker_results, "",
          "The one-worker run's JSON lines (for the two-worker ratio).");
ABSL_FLAG(int, rank, 0,
          "Trainer rank (and its CUDA device) of the multi-GPU run.");
ABSL_FLAG(int, ranks, 1,
          "Trainers, one per GPU and process (> 1: the multi-GPU run, "
          "all ranks started together, each with its GPU's worker).");
ABSL_FLAG(std::string, layout, "replicated",
          "Multi-GPU run: replicated | unreduced | row_sharded (each rank "
          "lends only its torch.chunk rows).");
ABSL_FLAG(std::string, worker_metrics, "",
          "Multi-GPU run, rank 0: each worker's /metrics HOST:PORT, "
          "comma-separated, in worker (GPU) order: bytes sent per step.");
ABSL_FLAG(int, dedicated_workers, 0,
          "Multi-GPU run: workers with no trainer (--dedicated) in the job.");
ABSL_FLAG(std::string, set, "llama",
          "Matrix set: llama (Llama-3-8B layers), gpt2 (GPT-2-small blocks) "
          "or moe (DeepSeek-V3-like MoE layers, "
          "bench/step_gpu/llama_matrices.h).");
ABSL_FLAG(int, layers, 8, "Layers of the set.");
ABSL_FLAG(int, experts, 64, "moe: routed experts per layer (V3 has 256).");
ABSL_FLAG(int, divisor, 1, "Divide every dimension (a quick logic check).");
ABSL_FLAG(int, warmup, 3, "Untimed steps first.");
ABSL_FLAG(int, repeats, 10, "Timed steps (median reported).");
ABSL_FLAG(std::string, precision, "bf16",
          "NS precision of the in-process "
          "kernels (as the worker's).");

namespace muonps {
namespace {

using bench::Shape;

void Line(const nlohmann::ordered_json& line) { bench::PrintLine(line); }

// The set --set names, or INVALID_ARGUMENT naming the flag.
absl::StatusOr<bench::MatrixSet> Matrices() {
  const std::string set = absl::GetFlag(FLAGS_set);
  const int layers = absl::GetFlag(FLAGS_layers);
  const int divisor = absl::GetFlag(FLAGS_divisor);
  if (layers < 1 || divisor < 1 || absl::GetFlag(FLAGS_experts) < 0) {
    return absl::InvalidArgumentError(
        "--layers and --divisor must be >= 1, --experts >= 0");
  }
  if (set == "llama") return bench::LlamaMatrices(layers, divisor);
  if (set == "gpt2") return bench::Gpt2SmallMatrices(layers, divisor);
  if (set == "moe") {
    return bench::MoeMatrices(layers, absl::GetFlag(FLAGS_experts), divisor);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--set: \"", set, "\" is not llama, gpt2 or moe"));
}

absl::Status RunRanks() {
  bench::RanksStepOptions o;
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.job = absl::GetFlag(FLAGS_job);
  o.worker_socket = absl::GetFlag(FLAGS_worker_socket);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.ranks = absl::GetFlag(FLAGS_ranks);
  const std::string layout = absl::GetFlag(FLAGS_layout);
  if (layout == "replicated") {
    o.layout = scheduler::Layout::kReplicated;
  } else if (layout == "unreduced") {
    o.layout = scheduler::Layout::kUnreduced;
  } else if (layout == "row_sharded") {
    o.layout = scheduler::Layout::kRowSharded;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--layout: \"", layout,
                     "\" is not replicated, unreduced or "
                     "row_sharded"));
  }
  o.dedicated_workers = absl::GetFlag(FLAGS_dedicated_workers);
  if (o.dedicated_workers < 0) {
    return absl::InvalidArgumentError("--dedicated_workers must be >= 0");
  }
  MUONPS_ASSIGN_OR_RETURN(o.matrices, Matrices());
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.repeats = absl::GetFlag(FLAGS_repeats);
  o.torch_results = absl::GetFlag(FLAGS_torch_results);
  o.one_worker_results = absl::GetFlag(FLAGS_one_worker_results);
  if (const std::string m = absl::GetFlag(FLAGS_worker_metrics); !m.empty()) {
    o.worker_metrics = absl::StrSplit(m, ',');
    const int workers = o.ranks + o.dedicated_workers;
    if (static_cast<int>(o.worker_metrics.size()) != workers) {
      return absl::InvalidArgumentError(
          absl::StrCat("--worker_metrics: ", o.worker_metrics.size(),
                       " addresses for ", workers, " workers"));
    }
  }
  return bench::RunRanksStep(o);
}

absl::Status Run() {
  if (absl::GetFlag(FLAGS_ranks) > 1) return RunRanks();
  if (absl::GetFlag(FLAGS_rank) != 0 ||
      absl::GetFlag(FLAGS_layout) != "replicated") {
    return absl::InvalidArgumentError(
        "--rank and --layout are for the multi-GPU run (--ranks > 1)");
  }
  const std::string two = absl::GetFlag(FLAGS_worker_sockets);
  if (!two.empty()) {
    const std::vector<std::string> sockets = absl::StrSplit(two, ',');
    if (sockets.size() != 2) {
      return absl::InvalidArgumentError("--worker_sockets: two paths");
    }
    MUONPS_ASSIGN_OR_RETURN(bench::MatrixSet matrices, Matrices());
    return bench::RunTwoTrainersStep(
        {.coordinator = absl::GetFlag(FLAGS_coordinator),
         .job = absl::GetFlag(FLAGS_job),
         .sockets = sockets,
         .matrices = std::move(matrices),
         .warmup = absl::GetFlag(FLAGS_warmup),
         .repeats = absl::GetFlag(FLAGS_repeats),
         .torch_results = absl::GetFlag(FLAGS_torch_results),
         .one_worker_results = absl::GetFlag(FLAGS_one_worker_results)});
  }
  bench::PeerResults peers;
  if (!absl::GetFlag(FLAGS_torch_results).empty()) {
    MUONPS_ASSIGN_OR_RETURN(
        peers, bench::PeerResults::Load(absl::GetFlag(FLAGS_torch_results)));
  }
  MUONPS_ASSIGN_OR_RETURN(const bench::MatrixSet matrices, Matrices());
  int64_t total = 0, largest = 0;
  for (const auto& [name, s, layer] : matrices) {
    total += s.rows * s.cols;
    largest = std::max(largest, s.rows * s.cols);
  }
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(0), "cudaSetDevice"));
  // Trainer memory: one allocation for gradients, one for parameters.
  float *grads = nullptr, *params = nullptr;
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&grads, total * sizeof(float)),
                                    "cudaMalloc grads"));
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&params, total * sizeof(float)),
                                    "cudaMalloc params"));
  {
    std::vector<float> pattern(largest);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : pattern) v = normal(rng) * 1e-3f;
    int64_t at = 0;
    for (const auto& [name, s, layer] : matrices) {
      const int64_t n = s.rows * s.cols;
      MUONPS_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(grads + at, pattern.data(), n * 4, cudaMemcpyHostToDevice),
          "fill grads"));
      MUONPS_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy(params + at, pattern.data(), n * 4,
                                cudaMemcpyHostToDevice),
                     "fill params"));
      at += n;
    }
  }
  MUONPS_ASSIGN_OR_RETURN(
      std::unique_ptr<Client> client,
      Client::Create({.coordinator = absl::GetFlag(FLAGS_coordinator),
                      .job = absl::GetFlag(FLAGS_job),
                      .worker_socket = absl::GetFlag(FLAGS_worker_socket),
                      .device = "cuda:0"}));
  {
    int64_t at = 0;
    for (size_t m = 0; m < matrices.size(); ++m) {
      const auto& [name, s, layer] = matrices[m];
      MUONPS_RETURN_IF_ERROR(client->AddMatrix(
          name, s.rows, s.cols,
          {.layout = TensorLayout::kReplicated, .layer = layer}));
      MUONPS_RETURN_IF_ERROR(client->LendCuda(name, grads + at, params + at));
      at += s.rows * s.cols;
    }
  }
  MuonOptions muon;
  muon.lr = 0.02;
  muon.weight_decay = 0.1;
  MUONPS_RETURN_IF_ERROR(client->Start(muon, {}));
  MUONPS_ASSIGN_OR_RETURN(const auto algorithms, client->NsAlgorithms());

  cudaStream_t stream = nullptr;
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  std::vector<double> step_ms, return_ms;
  // Per measured step, on the steady clock (the workers' timelines say when
  // each round began on it): the Step call, its return, and when the
  // trainer's stream saw the parameters.
  nlohmann::ordered_json on_clock = nlohmann::ordered_json::array();
  const int warmup = absl::GetFlag(FLAGS_warmup);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  for (int step = 0; step < warmup + repeats; ++step) {
    const auto start = std::chrono::steady_clock::now();
    MUONPS_RETURN_IF_ERROR(
        client->Step(step, {.stream = stream, .async = true}).status());
    const auto returned = std::chrono::steady_clock::now();
    MUONPS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "sync"));
    const auto seen = std::chrono::steady_clock::now();
    MUONPS_ASSIGN_OR_RETURN(const StepResult result, client->Wait());
    if (result.already_applied) return absl::InternalError("already applied");
    if (step < warmup) continue;
    step_ms.push_back(
        std::chrono::duration<double, std::milli>(seen - start).count());
    return_ms.push_back(
        std::chrono::duration<double, std::milli>(returned - start).count());
    on_clock.push_back({step, bench::SteadyClockMs(start),
                        bench::SteadyClockMs(returned),
                        bench::SteadyClockMs(seen)});
  }

  // The kernels alone, in this process: the same stacks the worker runs.
  MUONPS_ASSIGN_OR_RETURN(
      const kernels::cuda::Precision precision,
      kernels::cuda::ParsePrecision(absl::GetFlag(FLAGS_precision)));
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::cuda::CudaKernels> k,
                          kernels::cuda::CudaKernels::Create(
                              {.device = 0, .precision = precision}));
  std::map<std::pair<int64_t, int64_t>, int64_t> counts;
  for (const auto& [name, s, layer] : matrices) ++counts[{s.rows, s.cols}];
  struct Stack {
    Shape shape;
    int64_t count;
    NsAlgorithm algorithm;
    float *grad, *momentum;
  };
  std::vector<Stack> stacks;
  for (const auto& [shape, count] : counts) {
    Stack s{{shape.first, shape.second},
            count,
            NsAlgorithm::kNs5,
            nullptr,
            nullptr};
    for (const auto& [name, m, layer] : matrices) {
      if (m.rows == shape.first && m.cols == shape.second) {
        s.algorithm = algorithms.at(name) == NewtonSchulz::kGram
                          ? NsAlgorithm::kGram
                          : NsAlgorithm::kNs5;
        break;
      }
    }
    const int64_t n = count * shape.first * shape.second;
    MUONPS_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&s.grad, n * 4), "stack"));
    MUONPS_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&s.momentum, n * 4), "stack"));
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(s.grad, grads, std::min(n, total) * 4,
                              cudaMemcpyDeviceToDevice),
                   "stack"));
    MUONPS_RETURN_IF_ERROR(
        CudaStatus(cudaMemset(s.momentum, 0, n * 4), "stack"));
    stacks.push_back(s);
  }
  std::vector<double> ns_ms;
  for (int r = 0; r < warmup + repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (const Stack& s : stacks) {
      const kernels::MatrixStack g{s.grad, s.count, s.shape.rows, s.shape.cols};
      const kernels::MatrixStack b{s.momentum, s.count, s.shape.rows,
                                   s.shape.cols};
      MUONPS_RETURN_IF_ERROR(k->UpdateMomentum(g, b, b, 0.95, true, g, stream));
      NewtonSchulzOptions ns;
      ns.algorithm = s.algorithm;
      MUONPS_RETURN_IF_ERROR(k->Orthogonalize(g, g, ns, stream));
    }
    MUONPS_RETURN_IF_ERROR(k->Synchronize(stream));
    if (r >= warmup) {
      ns_ms.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    }
  }
  for (const Stack& s : stacks) {
    cudaFree(s.grad);
    cudaFree(s.momentum);
  }
  MUONPS_ASSIGN_OR_RETURN(const std::string device_name,
                          kernels::cuda::CudaDeviceName(0));
  const double ns_all = Median(ns_ms);
  const double step = Median(step_ms);
  const double ret = Median(return_ms);
  const auto torch_muon = peers.Number("torch_muon_step_1gpu", "ms");
  const auto adamw = peers.Number("adamw_fused_step", "ms");
  Line({{"what", "muonps_ns_all"},
        {"device", device_name},
        {"matrices", matrices.size()},
        {"params", total},
        {"precision", absl::GetFlag(FLAGS_precision)},
        {"ms", ns_all},
        {"over_torch_muon_step", bench::Ratio(ns_all, torch_muon)}});
  Line({{"what", "muonps_step_1gpu"},
        {"ms", step},
        {"over_muonps_ns_all", step / ns_all},
        {"over_torch_muon_step", bench::Ratio(step, torch_muon)},
        {"over_adamw_fused_step", bench::Ratio(step, adamw)},
        {"targets", "<= 1.10 x muonps_ns_all, < 0.65 x torch_muon_step_1gpu"}});
  // [step, Step called, returned, parameters seen] in ms on the steady
  // clock, to set beside the worker's timelines (their began_at_ms).
  Line({{"what", "muonps_step_1gpu_clock"}, {"steps", on_clock}});
  Line({{"what", "muonps_step_return"},
        {"ms", ret},
        {"target_ms", 1.0},
        {"note",
         "Step(async): records the trainer's ready event, enqueues its "
         "stream's wait for the worker's done counter, sends the RPC from "
         "a background thread"}});
  if (const auto gemm = peers.Number("gemm_bf16", "tflops")) {
    Line({{"what", "gemm_bf16"}, {"tflops", *gemm}, {"source", "torch"}});
  }
  client.reset();
  cudaFree(grads);
  cudaFree(params);
  return absl::OkStatus();
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Logs (the kernels' first-use choices among them) go to stderr: stdout
  // carries the JSON lines.
  const absl::Status logging =
      muonps::SetUpLogging({.component = "step_gpu_bench"});
  if (!logging.ok()) {
    std::fprintf(stderr, "step_gpu_bench: %s\n", logging.ToString().c_str());
    return 1;
  }
  const absl::Status status = muonps::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "step_gpu_bench rank %d: %s\n",
                 absl::GetFlag(FLAGS_rank), status.ToString().c_str());
    return 1;
  }
  return 0;
}
