#include "bench/step_gpu/ranks_step.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "bench/ns_gpu/peer_results.h"
#include "bench/step_gpu/worker_views.h"
#include "client/client.h"
#include "common/cuda_status.h"
#include "common/row_ranges.h"
#include "common/statistics.h"
#include "common/status.h"

namespace muonps {
namespace bench {
namespace {

// Progress on stderr, with the rank and the seconds since the start, so a
// run that stalls says where.
class Progress {
 public:
  explicit Progress(int rank) : rank_(rank) {}
  void Say(const std::string& what) const {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_)
            .count();
    std::fprintf(stderr, "step_gpu_bench rank %d [%.1f s]: %s\n", rank_, s,
                 what.c_str());
  }

 private:
  const int rank_;
  const std::chrono::steady_clock::time_point start_ =
      std::chrono::steady_clock::now();
};

nlohmann::json OrNull(std::optional<double> value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

absl::Status RunRanksStep(const RanksStepOptions& o) {
  if (o.ranks < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ranks: ", o.ranks, " (the multi-GPU run needs 2+)"));
  }
  if (o.rank < 0 || o.rank >= o.ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank: ", o.rank, " is not in [0, ", o.ranks, ")"));
  }
  if (o.repeats < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError("--repeats >= 1 and --warmup >= 0");
  }
  const Progress progress(o.rank);
  const std::string layout(scheduler::LayoutName(o.layout));
  PeerResults peers, one_worker;
  if (o.rank == 0 && !o.torch_results.empty()) {
    MUONPS_ASSIGN_OR_RETURN(peers, PeerResults::Load(o.torch_results));
  }
  if (o.rank == 0 && !o.one_worker_results.empty()) {
    MUONPS_ASSIGN_OR_RETURN(one_worker,
                            PeerResults::Load(o.one_worker_results));
  }
  // This rank's part of each matrix: all of it, or its torch.chunk rows.
  const bool sharded = o.layout == scheduler::Layout::kRowSharded;
  std::vector<int64_t> local;
  int64_t total = 0, local_total = 0, largest = 0;
  for (const auto& [name, s, layer] : o.matrices) {
    const auto [begin, end] = TrainerRowRange(s.rows, o.rank, o.ranks);
    local.push_back((sharded ? end - begin : s.rows) * s.cols);
    total += s.rows * s.cols;
    local_total += local.back();
    largest = std::max(largest, local.back());
  }
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(o.rank), "cudaSetDevice"));
  float *grads = nullptr, *params = nullptr;
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaMalloc(&grads, local_total * sizeof(float)), "cudaMalloc grads"));
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaMalloc(&params, local_total * sizeof(float)), "cudaMalloc params"));
  {
    // Each rank its own gradients (unreduced: the parts differ).
    std::vector<float> pattern(largest);
    std::mt19937 rng(1 + o.rank);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : pattern) v = normal(rng) * 1e-3f;
    int64_t at = 0;
    for (const int64_t n : local) {
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
  progress.Say(absl::StrCat("GPU ", o.rank, ": ", o.matrices.size(),
                            " matrices, ", local_total, " of ", total,
                            " parameters here (", layout, ")"));
  MUONPS_ASSIGN_OR_RETURN(
      std::unique_ptr<Client> client,
      Client::Create({.coordinator = o.coordinator,
                      .job = o.job,
                      .worker_socket = o.worker_socket,
                      .trainer_rank = o.rank,
                      .trainer_count = o.ranks,
                      .timeout = absl::Seconds(120),
                      .device = absl::StrCat("cuda:", o.rank)}));
  {
    const TensorLayout client_layout =
        o.layout == scheduler::Layout::kRowSharded  ? TensorLayout::kRowSharded
        : o.layout == scheduler::Layout::kUnreduced ? TensorLayout::kUnreduced
                                                    : TensorLayout::kReplicated;
    int64_t at = 0;
    for (size_t m = 0; m < o.matrices.size(); ++m) {
      const auto& [name, s, layer] = o.matrices[m];
      MUONPS_RETURN_IF_ERROR(client->AddMatrix(
          name, s.rows, s.cols, {.layout = client_layout, .layer = layer}));
      MUONPS_RETURN_IF_ERROR(client->LendCuda(name, grads + at, params + at));
      at += local[m];
    }
  }
  MuonOptions muon;
  muon.lr = 0.02;
  muon.weight_decay = 0.1;
  MUONPS_RETURN_IF_ERROR(client->ExpectDedicatedWorkers(o.dedicated_workers));
  MUONPS_RETURN_IF_ERROR(client->Start(muon, {}));
  progress.Say("started (the workers follow a plan and hold the buffers)");
  // No worker has moved a byte before rank 0's first Step: the workers
  // build their transport at the first step, together.
  std::vector<WorkerMetrics> before;
  for (const std::string& address : o.worker_metrics) {
    MUONPS_ASSIGN_OR_RETURN(WorkerMetrics b, ScrapeWorkerMetrics(address));
    before.push_back(std::move(b));
  }
  cudaStream_t stream = nullptr;
  MUONPS_RETURN_IF_ERROR(CudaStatus(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  std::vector<double> step_ms, every_ms;
  std::vector<int64_t> versions;  // the plan each step ran under
  // Per step, [step, Step called, parameters seen] in ms on the steady
  // clock, to set beside the workers' timelines (their began_at_ms).
  nlohmann::ordered_json on_clock = nlohmann::ordered_json::array();
  StepResult last;
  const int steps = o.warmup + o.repeats;
  for (int step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    MUONPS_RETURN_IF_ERROR(
        client->Step(step, {.stream = stream, .async = true}).status());
    MUONPS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream), "sync"));
    const auto seen = std::chrono::steady_clock::now();
    MUONPS_ASSIGN_OR_RETURN(last, client->Wait());
    if (last.already_applied) {
      return absl::InternalError(
          absl::StrCat("step ", step, " answered already applied"));
    }
    const double ms =
        std::chrono::duration<double, std::milli>(seen - start).count();
    if (step == 0) progress.Say(absl::StrCat("first step: ", ms, " ms"));
    if (step >= o.warmup) step_ms.push_back(ms);
    every_ms.push_back(std::round(ms * 1e3) / 1e3);
    versions.push_back(last.plan_version);
    on_clock.push_back({step, SteadyClockMs(start), SteadyClockMs(seen)});
  }
  const double ms = Median(step_ms);
  progress.Say(absl::StrCat(steps, " steps, median ", ms, " ms"));
  const std::string what = absl::StrCat("muonps_step_", o.ranks, "gpu");
  PrintLine({{"what", what + "_clock"}, {"rank", o.rank}, {"steps", on_clock}});
  if (o.rank != 0) {
    PrintLine({{"what", what + "_rank"},
               {"rank", o.rank},
               {"layout", layout},
               {"ms", ms}});
  } else {
    const std::string owner =
        absl::StrCat("torch_owner_muon_step_", o.ranks, "gpu");
    const std::string allreduce =
        absl::StrCat("torch_ddp_allreduce_", o.ranks, "gpu");
    PrintLine({{"what", what},
               {"layout", layout},
               {"ranks", o.ranks},
               {"dedicated_workers", o.dedicated_workers},
               {"ms", ms},
               {"matrices", o.matrices.size()},
               {"params", total},
               {"over_muonps_step_1gpu",
                Ratio(ms, one_worker.Number("muonps_step_1gpu", "ms"))},
               {"over_" + owner, Ratio(ms, peers.Number(owner, "ms"))},
               {"over_adamw_fused_step",
                Ratio(ms, peers.Number("adamw_fused_step", "ms"))},
               {"over_torch_muon_step_1gpu",
                Ratio(ms, peers.Number("torch_muon_step_1gpu", "ms"))},
               {allreduce + "_ms", OrNull(peers.Number(allreduce, "ms"))},
               {"worker0_step_seconds", last.seconds},
               {"worker0_step_bytes_moved", last.bytes_moved},
               {"warmup", o.warmup},
               {"repeats", o.repeats},
               // Every step, warm-up included, and its plan version: a
               // re-plan (measured speeds, a lost worker) shows where it
               // landed.
               {"every_step_ms", every_ms},
               {"plan_versions", versions}});
  }
  if (o.rank == 0)
    MUONPS_RETURN_IF_ERROR(PrintPlan(o.coordinator, o.job, layout, o.ranks));
  // What one rank of a ring all-reduce of the fp32 gradients sends.
  const double ddp = 2.0 * (o.ranks - 1) / o.ranks * 4.0 * total;
  for (size_t w = 0; w < o.worker_metrics.size(); ++w) {
    MUONPS_ASSIGN_OR_RETURN(const WorkerMetrics after,
                            ScrapeWorkerMetricsSettled(o.worker_metrics[w]));
    const double sent = (after.sent - before[w].sent) / steps;
    // Per step, by operation: what `after` counted past `was`.
    const auto per_step = [&](const std::map<std::string, double>& now,
                              const std::map<std::string, double>& was) {
      nlohmann::ordered_json by_op = nlohmann::ordered_json::object();
      for (const auto& [op, value] : now) {
        const auto it = was.find(op);
        by_op[op] = (value - (it == was.end() ? 0 : it->second)) / steps;
      }
      return by_op;
    };
    PrintLine(
        {{"what", "muonps_bytes_sent_per_step"},
         {"worker", w},
         {"layout", layout},
         {"ranks", o.ranks},
         {"bytes", sent},
         {"received_bytes", (after.received - before[w].received) / steps},
         {"ddp_allreduce_bytes", ddp},
         {"ratio", Ratio(sent, ddp)},
         {"sent_by_op", per_step(after.sent_by_op, before[w].sent_by_op)},
         // The transport's calls and what they ran as (NCCL launches: the
         // host's fixed cost of moving them), per step, control included.
         {"calls_by_op", per_step(after.calls_by_op, before[w].calls_by_op)},
         {"launches", (after.launches - before[w].launches) / steps},
         {"steps", steps}});
    // The cost model against the device, worker by worker (last step).
    if (after.compute_seconds >= 0 && after.predicted_seconds >= 0) {
      PrintLine({{"what", "muonps_cost_model_worker"},
                 {"worker", w},
                 {"layout", layout},
                 {"ranks", o.ranks},
                 {"predicted_compute_ms", after.predicted_seconds * 1e3},
                 {"measured_compute_ms", after.compute_seconds * 1e3},
                 {"error",
                  after.compute_seconds > 0
                      ? nlohmann::json(
                            after.predicted_seconds / after.compute_seconds - 1)
                      : nlohmann::json()}});
    }
  }
  client.reset();
  cudaStreamDestroy(stream);
  cudaFree(grads);
  cudaFree(params);
  return absl::OkStatus();
}

}  // namespace bench
}  // namespace muonps
