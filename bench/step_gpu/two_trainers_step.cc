#include "bench/step_gpu/two_trainers_step.h"

#include <cuda_runtime.h>

#include <chrono>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/ns_gpu/peer_results.h"
#include "client/client.h"
#include "common/cuda_status.h"
#include "common/statistics.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace bench {

// Two trainers (clients of this process, each with its own copy of the
// parameters and its own stream, as two processes would have) and two
// workers sharing the GPU over CUDA IPC: muonps_step_1gpu_2workers, from
// both Step calls until both streams see their parameters updated.
absl::Status RunTwoTrainersStep(const TwoTrainersOptions& o) {
  PeerResults peers, one_worker;
  if (!o.torch_results.empty()) {
    MUONPS_ASSIGN_OR_RETURN(peers, PeerResults::Load(o.torch_results));
  }
  if (!o.one_worker_results.empty()) {
    MUONPS_ASSIGN_OR_RETURN(one_worker,
                            PeerResults::Load(o.one_worker_results));
  }
  const MatrixSet& matrices = o.matrices;
  int64_t total = 0;
  for (const auto& [name, s, layer] : matrices) total += s.rows * s.cols;
  MUONPS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(0), "cudaSetDevice"));
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<float*> blocks;
  std::vector<cudaStream_t> streams(2, nullptr);
  for (int t = 0; t < 2; ++t) {
    float* block = nullptr;
    MUONPS_RETURN_IF_ERROR(CudaStatus(
        cudaMalloc(&block, 2 * total * sizeof(float)), "cudaMalloc"));
    MUONPS_RETURN_IF_ERROR(CudaStatus(
        cudaMemset(block, 0, 2 * total * sizeof(float)), "cudaMemset"));
    blocks.push_back(block);
    MUONPS_RETURN_IF_ERROR(CudaStatus(
        cudaStreamCreateWithFlags(&streams[t], cudaStreamNonBlocking),
        "stream"));
    MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                            Client::Create({.coordinator = o.coordinator,
                                            .job = o.job,
                                            .worker_socket = o.sockets[t],
                                            .trainer_rank = t,
                                            .trainer_count = 2,
                                            .device = "cuda:0"}));
    int64_t at = 0;
    for (size_t m = 0; m < matrices.size(); ++m) {
      const auto& [name, s, layer] = matrices[m];
      MUONPS_RETURN_IF_ERROR(
          client->AddMatrix(name, s.rows, s.cols, {.layer = layer}));
      MUONPS_RETURN_IF_ERROR(
          client->LendCuda(name, block + at, block + total + at));
      at += s.rows * s.cols;
    }
    clients.push_back(std::move(client));
  }
  MuonOptions muon;
  muon.lr = 0.02;
  muon.weight_decay = 0.1;
  std::vector<absl::Status> started(2);
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back(
          [&, t] { started[t] = clients[t]->Start(muon, {}); });
    }
    for (auto& th : threads) th.join();
  }
  for (const absl::Status& st : started) MUONPS_RETURN_IF_ERROR(st);
  std::vector<double> step_ms;
  const int warmup = o.warmup;
  for (int step = 0; step < warmup + o.repeats; ++step) {
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < 2; ++t) {
      MUONPS_RETURN_IF_ERROR(
          clients[t]
              ->Step(step, {.stream = streams[t], .async = true})
              .status());
    }
    for (int t = 0; t < 2; ++t) {
      MUONPS_RETURN_IF_ERROR(
          CudaStatus(cudaStreamSynchronize(streams[t]), "sync"));
    }
    const auto seen = std::chrono::steady_clock::now();
    for (int t = 0; t < 2; ++t) {
      MUONPS_RETURN_IF_ERROR(clients[t]->Wait().status());
    }
    if (step >= warmup) {
      step_ms.push_back(
          std::chrono::duration<double, std::milli>(seen - start).count());
    }
  }
  const double ms = Median(step_ms);
  PrintLine({{"what", "muonps_step_1gpu_2workers"},
             {"ms", ms},
             {"transport", "cuda_ipc"},
             {"over_muonps_step_1gpu",
              Ratio(ms, one_worker.Number("muonps_step_1gpu", "ms"))},
             {"over_torch_muon_step",
              Ratio(ms, peers.Number("torch_muon_step_1gpu", "ms"))},
             {"note",
              "two trainers and two workers share one GPU: the same "
              "Newton-Schulz work split in two, plus IPC peer copies"}});
  clients.clear();
  for (float* b : blocks) cudaFree(b);
  return absl::OkStatus();
}

// The multi-GPU run (ranks_step.h) from the flags.
}  // namespace bench
}  // namespace muonps
