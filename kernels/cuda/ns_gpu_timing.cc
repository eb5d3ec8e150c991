// ns_gpu_timing: times the CUDA Newton-Schulz engine on the 8-layer
// Llama-3-8B matrix set (56 matrices: 4096x4096 x16 with NS5, 1024x4096
// x16, 14336x4096 x16 and 4096x14336 x8 with Gram NS) for several
// symmetric-product plans and precisions, and prints one JSON line per
// variant (median of --repeats runs, per-shape ms, executed TFLOP/s), then a
// table. A developer tool to steer the kernels; bench/ns_gpu is the
// benchmark of record. Exits 1 on any CUDA error or non-finite output.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/statistics.h"
#include "kernels/cuda/device_buffer.h"
#include "kernels/cuda/micro_benchmarks.h"
#include "kernels/cuda/ns_engine.h"
#include "newton_schulz/flops.h"

ABSL_FLAG(int, repeats, 5, "Timed runs of the whole set per variant.");
ABSL_FLAG(std::string, only, "",
          "Run only variants whose name contains this text.");
ABSL_FLAG(bool, micro, true,
          "First time the kernels NS is made of (micro_benchmarks).");
ABSL_FLAG(bool, micro_gemm, false,
          "With --micro, also time cuBLAS GEMMs and cuBLASLt's algorithms.");

namespace muonps {
namespace kernels {
namespace cuda {
namespace {

struct StackSpec {
  int64_t count, rows, cols;
  NsAlgorithm algorithm;
};

struct Variant {
  std::string name;
  cudaDataType low;
  SymmetricPlan plan;
  bool graphs = true;
  bool all_ns5 = false;
  bool no_restart = false;
  int lanes = 1;
  std::vector<int> gram_restarts = {2};
  bool aol = false;
  int steps = 5;
};

const StackSpec kLlamaSet[] = {{16, 4096, 4096, NsAlgorithm::kNs5},
                               {16, 1024, 4096, NsAlgorithm::kGram},
                               {16, 14336, 4096, NsAlgorithm::kGram},
                               {8, 4096, 14336, NsAlgorithm::kGram}};

std::vector<Variant> Variants() {
  const auto plan = [](SymmetricMode mode, int blocks, int min_rows = 256) {
    return SymmetricPlan{mode, blocks, min_rows};
  };
  std::vector<Variant> v = {
      {"bf16_tiles16", CUDA_R_16BF, plan(SymmetricMode::kTiles, 16)},
      {"bf16_tiles8", CUDA_R_16BF, plan(SymmetricMode::kTiles, 8)},
      {"bf16_tiles16_2lanes", CUDA_R_16BF, plan(SymmetricMode::kTiles, 16)},
      {"fp16_tiles16", CUDA_R_16F, plan(SymmetricMode::kTiles, 16)},
      {"fp32_tiles16", CUDA_R_32F, plan(SymmetricMode::kTiles, 16)},
  };
  v[2].lanes = 2;
  const Variant base = v[0];  // bf16_tiles16, CudaKernels' default
  Variant eager = base;
  eager.name = "bf16_tiles16_nographs";
  eager.graphs = false;
  Variant ns5 = base;
  ns5.name = "bf16_tiles16_all_ns5";
  ns5.all_ns5 = true;
  Variant no_restart = base;
  no_restart.name = "bf16_tiles16_gram_no_restart";
  no_restart.no_restart = true;
  v.push_back(eager);
  v.push_back(ns5);
  v.push_back(no_restart);
  // The symmetric-product plans beside the default's 16 tiles.
  const std::pair<const char*, SymmetricPlan> plans[] = {
      {"bf16_tiles4", plan(SymmetricMode::kTiles, 4)},
      {"bf16_tiles32", plan(SymmetricMode::kTiles, 32, 128)},
      {"bf16_rows4", plan(SymmetricMode::kRowBlocks, 4)},
      {"bf16_rows8", plan(SymmetricMode::kRowBlocks, 8)},
      {"bf16_dense", plan(SymmetricMode::kDense, 1)},
      {"bf16_lttiles16", plan(SymmetricMode::kLtTiles, 16)},
      {"bf16_lttiles8", plan(SymmetricMode::kLtTiles, 8)},
      {"bf16_lttiles4", plan(SymmetricMode::kLtTiles, 4)}};
  for (const auto& [name, p] : plans) {
    Variant x = base;
    x.name = name;
    x.plan = p;
    v.push_back(x);
  }
  // Gram's accurate schedule (restarts after steps 1, 3 and 4) and AOL with
  // one step fewer (opt-in), both on the default plan.
  Variant restarts134 = base;
  restarts134.name = "bf16_tiles16_gram_restarts134";
  restarts134.gram_restarts = {1, 3, 4};
  v.push_back(restarts134);
  Variant aol = base;
  aol.name = "bf16_tiles16_aol4";
  aol.aol = true;
  aol.steps = 4;
  v.push_back(aol);
  return v;
}

bool Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// Uniform values in [-1, 1): never zeros, which run faster than real data.
std::vector<float> RandomHost(int64_t n, uint64_t seed) {
  std::vector<float> v(n);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : v) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(static_cast<int64_t>(state >> 40) - (1 << 23)) /
        (1 << 23);
  }
  return v;
}

struct Stack {
  StackSpec spec;
  DeviceBuffer in, out;
};

int Main() {
  cudaStream_t stream = nullptr;
  cublasHandle_t handle = nullptr;
  if (!Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
             "stream") ||
      cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
    return 1;
  }
  cublasSetStream(handle, stream);
  auto cublas_ws = DeviceBuffer::Allocate(64 << 20, "cuBLAS workspace");
  if (!cublas_ws.ok()) return 1;
  cublasSetWorkspace(handle, cublas_ws->get(), cublas_ws->bytes());
  cudaStream_t side_stream = nullptr;
  cublasHandle_t side_handle = nullptr;
  if (!Check(cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking),
             "side stream") ||
      cublasCreate(&side_handle) != CUBLAS_STATUS_SUCCESS) {
    return 1;
  }
  cublasSetStream(side_handle, side_stream);
  auto side_ws = DeviceBuffer::Allocate(64 << 20, "second cuBLAS workspace");
  if (!side_ws.ok()) return 1;
  cublasSetWorkspace(side_handle, side_ws->get(), side_ws->bytes());
  if (absl::GetFlag(FLAGS_micro) &&
      !RunMicroBenchmarks(handle, stream, absl::GetFlag(FLAGS_micro_gemm))) {
    std::fprintf(stderr, "micro benchmarks failed\n");
    return 1;
  }

  std::vector<Stack> stacks;
  for (const StackSpec& spec : kLlamaSet) {
    const int64_t per = spec.rows * spec.cols;
    const size_t bytes = static_cast<size_t>(spec.count * per) * sizeof(float);
    auto in = DeviceBuffer::Allocate(bytes, "input");
    auto out = DeviceBuffer::Allocate(bytes, "output");
    if (!in.ok() || !out.ok()) return 1;
    for (int64_t i = 0; i < spec.count; ++i) {
      const std::vector<float> host = RandomHost(per, 7 * i + spec.rows);
      if (!Check(cudaMemcpy(in->as<float>() + i * per, host.data(),
                            per * sizeof(float), cudaMemcpyHostToDevice),
                 "upload")) {
        return 1;
      }
    }
    stacks.push_back({spec, std::move(*in), std::move(*out)});
  }

  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<std::string> table;
  for (const Variant& v : Variants()) {
    if (!absl::StrContains(v.name, absl::GetFlag(FLAGS_only))) continue;
    std::vector<NsLane> lanes = {
        {handle, cublas_ws->get(), cublas_ws->bytes()}};
    if (v.lanes == 2) {
      lanes.push_back(
          {side_handle, side_ws->get(), side_ws->bytes(), side_stream});
    }
    NsEngine engine(lanes, v.low, v.plan, v.graphs);
    std::vector<NewtonSchulzOptions> options;
    double flops = 0;
    for (const Stack& s : stacks) {
      NewtonSchulzOptions o;
      o.algorithm = v.all_ns5 ? NsAlgorithm::kNs5 : s.spec.algorithm;
      o.gram_restarts = v.gram_restarts;
      o.aol = v.aol;
      o.steps = v.steps;
      if (v.no_restart) o.gram_restarts.clear();
      flops += s.spec.count * NsExecutedFlops(s.spec.rows, s.spec.cols, o);
      options.push_back(o);
    }
    std::vector<cudaEvent_t> events(stacks.size() + 1);
    for (cudaEvent_t& e : events) cudaEventCreate(&e);
    std::vector<std::vector<double>> shape_ms(stacks.size());
    std::vector<double> total_ms;
    bool ok = true;
    for (int run = -1; run < repeats && ok; ++run) {  // run -1: warm-up
      for (size_t i = 0; i < stacks.size() && ok; ++i) {
        cudaEventRecord(events[i], stream);
        const Stack& s = stacks[i];
        const absl::Status status =
            engine.Run(s.in.as<float>(), s.out.as<float>(), s.spec.count,
                       s.spec.rows, s.spec.cols, options[i], stream);
        if (!status.ok()) {
          std::fprintf(stderr, "%s: %s\n", v.name.c_str(),
                       status.ToString().c_str());
          ok = false;
        }
      }
      cudaEventRecord(events.back(), stream);
      ok = ok && Check(cudaStreamSynchronize(stream), v.name.c_str());
      if (!ok || run < 0) continue;
      float ms = 0;
      for (size_t i = 0; i < stacks.size(); ++i) {
        cudaEventElapsedTime(&ms, events[i], events[i + 1]);
        shape_ms[i].push_back(ms);
      }
      cudaEventElapsedTime(&ms, events[0], events.back());
      total_ms.push_back(ms);
    }
    for (cudaEvent_t& e : events) cudaEventDestroy(e);
    if (!ok) return 1;
    // Spot check: the first 4096 outputs of every stack are finite.
    for (const Stack& s : stacks) {
      std::vector<float> head(4096);
      cudaMemcpy(head.data(), s.out.get(), head.size() * sizeof(float),
                 cudaMemcpyDeviceToHost);
      for (const float x : head) {
        if (!std::isfinite(x)) {
          std::fprintf(stderr, "%s: non-finite output\n", v.name.c_str());
          return 1;
        }
      }
    }
    const double total = Median(total_ms);
    std::string line = absl::StrCat(
        "{\"what\":\"ns_llama8b_8layer_set\",\"variant\":\"", v.name,
        "\",\"matrices\":56,\"total_ms\":", total,
        ",\"executed_tflops\":", flops / (total * 1e9), ",\"shapes\":[");
    std::string row = absl::StrCat(v.name, ": ", total, " ms (",
                                   flops / (total * 1e9), " TFLOP/s)");
    for (size_t i = 0; i < stacks.size(); ++i) {
      const StackSpec& sp = stacks[i].spec;
      const double ms = Median(shape_ms[i]);
      const double f = sp.count * NsExecutedFlops(sp.rows, sp.cols, options[i]);
      absl::StrAppend(&line, i ? "," : "", "{\"shape\":\"", sp.count, "x",
                      sp.rows, "x", sp.cols, "\",\"algorithm\":\"",
                      NsAlgorithmName(options[i].algorithm), "\",\"ms\":", ms,
                      ",\"tflops\":", f / (ms * 1e9), "}");
      absl::StrAppend(&row, " | ", sp.count, "x", sp.rows, "x", sp.cols, " ",
                      ms, " ms ", f / (ms * 1e9));
    }
    absl::StrAppend(&line, "]}");
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    table.push_back(row);
  }
  for (const std::string& row : table) std::printf("%s\n", row.c_str());
  cublasDestroy(side_handle);
  cudaStreamDestroy(side_stream);
  cublasDestroy(handle);
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Logs (the kernels' first-use choices among them) go to stderr: stdout
  // carries the JSON lines.
  const absl::Status logging =
      muonps::SetUpLogging({.component = "ns_gpu_timing"});
  if (!logging.ok()) {
    std::fprintf(stderr, "ns_gpu_timing: %s\n", logging.ToString().c_str());
    return 1;
  }
  return muonps::kernels::cuda::Main();
}
