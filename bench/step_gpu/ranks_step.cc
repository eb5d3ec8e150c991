#include "bench/step_gpu/ranks_step.h"

#include <cuda_runtime.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/ns_gpu/peer_results.h"
#include "client/client.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "kernels/cuda/cuda_status.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "proto/credentials.h"
#include "proto/grpc_status.h"

namespace muonps {
namespace bench {
namespace {

constexpr char kSentMetric[] = "muonps_worker_transport_bytes_sent_total";
constexpr char kReceivedMetric[] =
    "muonps_worker_transport_bytes_received_total";

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

constexpr char kComputeMetric[] = "muonps_worker_step_compute_seconds";
constexpr char kPredictedMetric[] =
    "muonps_worker_step_compute_predicted_seconds";

// One worker's transport byte counters, summed over their "op" labels, and
// its last step's compute time with the plan's prediction of it (-1: the
// worker has no such gauge).
struct TransportBytes {
  double sent = 0, received = 0;
  std::map<std::string, double> sent_by_op;
  double compute_seconds = -1, predicted_seconds = -1;
};

// GETs http://HOST:PORT/metrics and sums the transport byte counters.
// UNAVAILABLE naming the address when it cannot be read;
// FAILED_PRECONDITION when the worker has no such counter (a binary built
// before it).
absl::StatusOr<TransportBytes> Scrape(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_metrics: \"", address, "\" is not HOST:PORT"));
  }
  httplib::Client client(address.substr(0, colon), port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  httplib::Result got = client.Get("/metrics");
  if (!got) {
    return absl::UnavailableError(absl::StrCat(
        "worker metrics at ", address, ": ", httplib::to_string(got.error())));
  }
  if (got->status != 200) {
    return absl::UnavailableError(absl::StrCat("worker metrics at ", address,
                                               ": HTTP status ", got->status));
  }
  if (got->body.find(absl::StrCat("# TYPE ", kSentMetric)) ==
      std::string::npos) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker metrics at ", address, " have no ", kSentMetric,
                     ": a muonps-worker built before it?"));
  }
  TransportBytes bytes;
  for (absl::string_view line : absl::StrSplit(got->body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == absl::string_view::npos ||
        value_at == absl::string_view::npos) {
      continue;
    }
    const absl::string_view name = line.substr(0, name_end);
    if (name != kSentMetric && name != kReceivedMetric &&
        name != kComputeMetric && name != kPredictedMetric) {
      continue;
    }
    double value = 0;
    if (!absl::SimpleAtod(line.substr(value_at + 1), &value)) {
      return absl::DataLossError(absl::StrCat(
          "worker metrics at ", address, ": unparsable line \"", line, "\""));
    }
    if (name == kComputeMetric) {
      bytes.compute_seconds = value;
      continue;
    }
    if (name == kPredictedMetric) {
      bytes.predicted_seconds = value;
      continue;
    }
    if (name == kReceivedMetric) {
      bytes.received += value;
      continue;
    }
    bytes.sent += value;
    std::string op = "all";
    if (const size_t at = line.find("op=\""); at != absl::string_view::npos) {
      const size_t end = line.find('"', at + 4);
      op = std::string(line.substr(at + 4, end - at - 4));
    }
    bytes.sent_by_op[op] += value;
  }
  return bytes;
}

// Scrapes until two reads 100 ms apart agree (a peer may still be counting
// the last step's final control message), at most 2 s.
absl::StatusOr<TransportBytes> ScrapeSettled(const std::string& address) {
  MUONPS_ASSIGN_OR_RETURN(TransportBytes last, Scrape(address));
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    MUONPS_ASSIGN_OR_RETURN(TransportBytes now, Scrape(address));
    if (now.sent == last.sent && now.received == last.received) return now;
    last = std::move(now);
  }
  return last;
}

// The job's plan as the coordinator published it (GetPlan), one line per
// worker: its predicted seconds and its batches (shape, members, the
// counts of the calls they run as, predicted seconds).
absl::Status PrintPlan(const RanksStepOptions& o, const std::string& layout) {
  MUONPS_ASSIGN_OR_RETURN(
      std::shared_ptr<grpc::Channel> channel,
      OpenChannel(o.coordinator, WithEnvironmentDefaults({})));
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::GetPlanRequest request;
  request.set_job(o.job);
  v1::Plan plan;
  MUONPS_RETURN_IF_ERROR(
      FromGrpc(stub->GetPlan(&context, request, &plan), "GetPlan"));
  for (int w = 0; w < plan.workers_size(); ++w) {
    const std::string& id = plan.workers(w);
    double predicted = -1;
    for (const v1::WorkerLoad& load : plan.loads()) {
      if (load.worker_id() == id) predicted = load.predicted_seconds();
    }
    nlohmann::json batches = nlohmann::json::array();
    for (const v1::Batch& b : plan.batches()) {
      if (b.worker_id() != id) continue;
      nlohmann::json parts = nlohmann::json::array();
      for (const v1::BatchPart& p : b.parts()) {
        parts.push_back({{"count", p.count()},
                         {"algorithm", v1::NsAlgorithm_Name(p.algorithm())},
                         {"predicted_ms", p.predicted_seconds() * 1e3}});
      }
      batches.push_back({{"shape", absl::StrCat(b.rows(), "x", b.cols())},
                         {"count", b.matrices_size()},
                         {"parts", parts},
                         {"predicted_ms", b.predicted_seconds() * 1e3}});
    }
    PrintLine({{"what", "muonps_plan_worker"},
               {"worker", w},
               {"worker_id", id},
               {"layout", layout},
               {"ranks", o.ranks},
               {"plan_version", plan.version()},
               {"predicted_ms", predicted >= 0 ? nlohmann::json(predicted * 1e3)
                                               : nlohmann::json()},
               {"batches", batches}});
  }
  return absl::OkStatus();
}

nlohmann::json OrNull(std::optional<double> value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

absl::Status Cuda(cudaError_t error, const std::string& what) {
  return kernels::cuda::CudaStatus(error, what);
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
  MUONPS_RETURN_IF_ERROR(Cuda(cudaSetDevice(o.rank), "cudaSetDevice"));
  float *grads = nullptr, *params = nullptr;
  MUONPS_RETURN_IF_ERROR(Cuda(cudaMalloc(&grads, local_total * sizeof(float)),
                              "cudaMalloc grads"));
  MUONPS_RETURN_IF_ERROR(Cuda(cudaMalloc(&params, local_total * sizeof(float)),
                              "cudaMalloc params"));
  {
    // Each rank its own gradients (unreduced: the parts differ).
    std::vector<float> pattern(largest);
    std::mt19937 rng(1 + o.rank);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : pattern) v = normal(rng) * 1e-3f;
    int64_t at = 0;
    for (const int64_t n : local) {
      MUONPS_RETURN_IF_ERROR(Cuda(
          cudaMemcpy(grads + at, pattern.data(), n * 4, cudaMemcpyHostToDevice),
          "fill grads"));
      MUONPS_RETURN_IF_ERROR(Cuda(cudaMemcpy(params + at, pattern.data(), n * 4,
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
                      .device = {MemoryKind::kCuda, o.rank}}));
  {
    int64_t at = 0;
    for (size_t m = 0; m < o.matrices.size(); ++m) {
      const auto& [name, s, layer] = o.matrices[m];
      MUONPS_RETURN_IF_ERROR(client->AddMatrix(
          name, s.rows, s.cols, {.layout = o.layout, .layer = layer}));
      MUONPS_RETURN_IF_ERROR(client->LendCuda(name, grads + at, params + at));
      at += local[m];
    }
  }
  kernels::MuonHyperparameters muon;
  muon.lr = 0.02;
  muon.weight_decay = 0.1;
  MUONPS_RETURN_IF_ERROR(client->ExpectDedicatedWorkers(o.dedicated_workers));
  MUONPS_RETURN_IF_ERROR(client->Start(muon, {}));
  progress.Say("started (the workers follow a plan and hold the buffers)");
  // No worker has moved a byte before rank 0's first Step: the workers
  // build their transport at the first step, together.
  std::vector<TransportBytes> before;
  for (const std::string& address : o.worker_metrics) {
    MUONPS_ASSIGN_OR_RETURN(TransportBytes b, Scrape(address));
    before.push_back(std::move(b));
  }
  cudaStream_t stream = nullptr;
  MUONPS_RETURN_IF_ERROR(Cuda(
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  std::vector<double> step_ms;
  StepResult last;
  const int steps = o.warmup + o.repeats;
  for (int step = 0; step < steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    MUONPS_RETURN_IF_ERROR(
        client
            ->Step(step,
                   {.stream = reinterpret_cast<Stream>(stream), .async = true})
            .status());
    MUONPS_RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream), "sync"));
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
  }
  const double ms = Median(step_ms);
  progress.Say(absl::StrCat(steps, " steps, median ", ms, " ms"));
  const std::string what = absl::StrCat("muonps_step_", o.ranks, "gpu");
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
               {"repeats", o.repeats}});
  }
  if (o.rank == 0) MUONPS_RETURN_IF_ERROR(PrintPlan(o, layout));
  // What one rank of a ring all-reduce of the fp32 gradients sends.
  const double ddp = 2.0 * (o.ranks - 1) / o.ranks * 4.0 * total;
  for (size_t w = 0; w < o.worker_metrics.size(); ++w) {
    MUONPS_ASSIGN_OR_RETURN(const TransportBytes after,
                            ScrapeSettled(o.worker_metrics[w]));
    const double sent = (after.sent - before[w].sent) / steps;
    nlohmann::ordered_json by_op;
    for (const auto& [op, value] : after.sent_by_op) {
      const auto was = before[w].sent_by_op.find(op);
      by_op[op] =
          (value - (was == before[w].sent_by_op.end() ? 0 : was->second)) /
          steps;
    }
    PrintLine(
        {{"what", "muonps_bytes_sent_per_step"},
         {"worker", w},
         {"layout", layout},
         {"ranks", o.ranks},
         {"bytes", sent},
         {"received_bytes", (after.received - before[w].received) / steps},
         {"ddp_allreduce_bytes", ddp},
         {"ratio", Ratio(sent, ddp)},
         {"sent_by_op", by_op},
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
