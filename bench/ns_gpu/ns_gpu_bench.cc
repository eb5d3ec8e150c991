// bench/ns_gpu: times muonps's CUDA backend on the Llama-3-8B matrix set (8
// layers: 4096x4096 x16, 1024x4096 x16, 14336x4096 x16, 4096x14336 x8) and
// prints JSON lines with ratios against the PyTorch peers that
// torch_peers.py measured on the same GPU in the same run (--torch_results;
// run.sh runs both).
//
// Lines: `gemm_bf16_cublas` and `gemm_bf16_cublas_half` (cuBLAS bf16 GEMM
// rates); `muonps_ns` per shape
// (NS5 and Gram NS timed, the faster kept; then the stack as 2, 4 or all
// single calls, a split kept when more than 2% faster, as a worker runs a
// batch its cost table splits); `muonps_ns_all` (the whole set, each shape
// with its faster algorithm and calls, as one timed region); and
// `muonps_update_1gpu` (MuonStep over the set: finite check, momentum, NS,
// weight decay and update). `tflops` counts the FLOPs the executed algorithm
// performs (newton_schulz/flops.h); `ns5_equiv_tflops` divides dense NS5's
// FLOPs by the same time; `fraction_of_gemm_peak` divides `tflops` by the
// highest bf16 GEMM rate measured in the run (torch.matmul and cuBLAS, at
// 8192^3 and 4096^3).
// Exits 1 with the error on stderr on any failure
// (e.g. no GPU).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/ns_gpu/gpu_timing.h"
#include "bench/ns_gpu/peer_results.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/cuda/cuda_device_ops.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_name.h"
#include "kernels/device_ops.h"
#include "newton_schulz/flops.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, torch_results, "",
          "JSON lines from torch_peers.py measured in the same run.");
ABSL_FLAG(std::string, precision, "bf16", "NS precision: bf16, fp16, fp32.");
ABSL_FLAG(int, device, 0, "GPU index.");
ABSL_FLAG(int, warmup, 2, "Untimed calls before each measurement.");
ABSL_FLAG(int, repeats, 7, "Timed calls per measurement (median kept).");
ABSL_FLAG(int, gemm_n, 8192, "Size of the cuBLAS bf16 GEMM (n^3).");
ABSL_FLAG(bool, lt_tiles, true,
          "Symmetric products through cuBLASLt with a timed algorithm search "
          "(CudaKernelsOptions::lt_tiles); false: cuBLAS's batched GEMM.");

namespace muonps {
namespace {

using Json = nlohmann::ordered_json;

// The project's targets, stated in the lines so a reader sees pass or miss.
constexpr double kTargetSpeedupVsTorchNs5 = 2.1;
constexpr double kTargetFractionOfGemm = 0.65;
constexpr double kTargetRatioToTorchMuon = 0.5;
constexpr double kTargetRatioToFloor = 1.25;

// One same-shape stack of the set with its buffers and measured times.
struct Group {
  int64_t rows, cols, count;
  std::unique_ptr<kernels::FloatBuffer> grad, momentum, param, out;
  NsAlgorithm best = NsAlgorithm::kNs5;
  // The calls the stack runs as (their counts, in order), as a worker
  // runs a batch its cost table says is faster split (BatchPart).
  std::vector<int64_t> calls;

  kernels::MatrixStack Stack(
      const std::unique_ptr<kernels::FloatBuffer>& buffer) const {
    return {buffer->data(), count, rows, cols};
  }
  // Matrices [first, first + n) of `buffer`.
  kernels::MatrixStack Part(const std::unique_ptr<kernels::FloatBuffer>& buffer,
                            int64_t first, int64_t n) const {
    return {buffer->data() + first * rows * cols, n, rows, cols};
  }
  // NS of every matrix (grad to out) in `split`'s calls.
  absl::Status Orthogonalize(kernels::cuda::CudaKernels& cuda,
                             const std::vector<int64_t>& split,
                             NsAlgorithm algorithm, Stream stream) const {
    int64_t first = 0;
    for (const int64_t n : split) {
      MUONPS_RETURN_IF_ERROR(cuda.Orthogonalize(
          Part(grad, first, n), Part(out, first, n), Ns(algorithm), stream));
      first += n;
    }
    return absl::OkStatus();
  }
  NewtonSchulzOptions Ns(NsAlgorithm algorithm) const {
    NewtonSchulzOptions ns;
    ns.algorithm = algorithm;
    return ns;
  }
  double Flops(NsAlgorithm algorithm) const {
    return count * NsExecutedFlops(rows, cols, Ns(algorithm));
  }
  double DenseFlops() const { return count * Ns5DenseFlops(rows, cols, 5); }
};

void Print(const Json& line) {
  std::printf("%s\n", line.dump().c_str());
  std::fflush(stdout);
}

// Fills `buffer` with random values in [-1, 1): copies of one random
// host matrix of `matrix` elements, each rotated differently, on the ops'
// stream (`host` must stay valid until it is synchronized).
absl::Status Fill(kernels::DeviceOps& ops, const std::vector<float>& host,
                  int64_t matrix, const kernels::FloatBuffer& buffer) {
  for (int64_t i = 0; i * matrix < buffer.size(); ++i) {
    const int64_t offset = (i * 7919) % matrix;
    float* target = buffer.data() + i * matrix;
    MUONPS_RETURN_IF_ERROR(
        ops.Copy(target, host.data() + offset, matrix - offset, ops.stream()));
    MUONPS_RETURN_IF_ERROR(
        ops.Copy(target + matrix - offset, host.data(), offset, ops.stream()));
  }
  return absl::OkStatus();
}

std::vector<float> RandomHost(int64_t count) {
  std::vector<float> values(count);
  uint64_t state = 12345;
  for (float& v : values) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<double>(state >> 40) * 0x1.0p-23 - 1.0);
  }
  return values;
}

absl::Status Run() {
  bench::PeerResults peers;
  const std::string torch_path = absl::GetFlag(FLAGS_torch_results);
  if (!torch_path.empty()) {
    MUONPS_ASSIGN_OR_RETURN(peers, bench::PeerResults::Load(torch_path));
  }
  const int device = absl::GetFlag(FLAGS_device);
  MUONPS_ASSIGN_OR_RETURN(const std::string device_name,
                          kernels::cuda::CudaDeviceName(device));
  // Memory, copies and the stream every timed call runs on.
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::cuda::CudaDeviceOps> ops,
                          kernels::cuda::CudaDeviceOps::Create(device));
  const Stream stream = ops->stream();
  kernels::cuda::CudaKernelsOptions options;
  options.device = device;
  options.lt_tiles = absl::GetFlag(FLAGS_lt_tiles);
  MUONPS_ASSIGN_OR_RETURN(
      options.precision,
      kernels::cuda::ParsePrecision(absl::GetFlag(FLAGS_precision)));
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<kernels::cuda::CudaKernels> cuda,
                          kernels::cuda::CudaKernels::Create(options));
  MUONPS_ASSIGN_OR_RETURN(
      std::unique_ptr<bench::EventTimer> timer,
      bench::EventTimer::Create(stream, absl::GetFlag(FLAGS_warmup),
                                absl::GetFlag(FLAGS_repeats)));
  const std::string precision(kernels::cuda::PrecisionName(options.precision));
  int runtime = 0;
  int driver = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  Json env;
  env["what"] = "ns_gpu_env";
  env["device"] = device_name;
  env["precision"] = precision;
  env["cuda_runtime"] = runtime;
  env["cuda_driver"] = driver;
  env["torch_results"] = !torch_path.empty();
  env["symmetric_products"] =
      options.lt_tiles ? "per_shape_timed_cublaslt_tiles8_or_cublas_tiles16"
                       : "cublas_batched_tiles16";
  Print(env);

  // The GEMM ceiling: the highest bf16 GEMM rate measured in the run
  // (cuBLAS and torch.matmul, at n^3 and (n/2)^3), so a power-limited or
  // slow measurement cannot flatter the fractions.
  const int64_t gemm_n = absl::GetFlag(FLAGS_gemm_n);
  double gemm_tflops = 0;
  double cublas_tflops = 0;
  for (const int64_t n : {gemm_n, gemm_n / 2}) {
    MUONPS_ASSIGN_OR_RETURN(const double ms,
                            bench::CublasBf16GemmMs(*timer, n));
    const double tflops = 2.0 * n * n * n / ms / 1e9;
    const std::optional<double> torch_gemm =
        peers.Number(n == gemm_n ? "gemm_bf16" : "gemm_bf16_half", "tflops");
    Json gemm;
    gemm["what"] = n == gemm_n ? "gemm_bf16_cublas" : "gemm_bf16_cublas_half";
    gemm["m"] = gemm["n"] = gemm["k"] = n;
    gemm["ms"] = ms;
    gemm["tflops"] = tflops;
    gemm["ratio_to_torch_gemm_bf16"] = bench::Ratio(tflops, torch_gemm);
    Print(gemm);
    cublas_tflops = std::max(cublas_tflops, tflops);
    gemm_tflops = std::max({gemm_tflops, tflops, torch_gemm.value_or(0)});
  }

  std::vector<Group> groups;
  for (const auto& [rows, cols, count] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{4096, 4096, 16},
                                                          {1024, 4096, 16},
                                                          {14336, 4096, 16},
                                                          {4096, 14336, 8}}) {
    Group g{rows, cols, count, {}, {}, {}, {}};
    const int64_t elements = rows * cols * count;
    for (std::unique_ptr<kernels::FloatBuffer>* buffer :
         {&g.grad, &g.momentum, &g.param, &g.out}) {
      MUONPS_ASSIGN_OR_RETURN(*buffer, ops->Allocate(elements, "a stack"));
    }
    groups.push_back(std::move(g));
  }
  const std::vector<float> host = RandomHost(14336 * 4096);
  for (const Group& g : groups) {
    for (const kernels::FloatBuffer* buffer :
         {g.grad.get(), g.momentum.get(), g.param.get()}) {
      MUONPS_RETURN_IF_ERROR(Fill(*ops, host, g.rows * g.cols, *buffer));
    }
  }
  MUONPS_RETURN_IF_ERROR(ops->Synchronize(stream));

  int64_t matrices = 0;
  double best_flops = 0;
  double dense_flops = 0;
  Json algorithms = Json::object();
  Json calls = Json::object();
  for (Group& g : groups) {
    double ms[2] = {0, 0};
    for (const NsAlgorithm algorithm :
         {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
      MUONPS_ASSIGN_OR_RETURN(
          ms[static_cast<int>(algorithm)], timer->MedianMs([&]() {
            return cuda->Orthogonalize(g.Stack(g.grad), g.Stack(g.out),
                                       g.Ns(algorithm), stream);
          }));
    }
    g.best = ms[1] < ms[0] ? NsAlgorithm::kGram : NsAlgorithm::kNs5;
    const double unsplit_ms = ms[static_cast<int>(g.best)];
    // Equal splits of the stack, each kept if more than 2% faster than
    // the best so far (the planner's rule for a cost table's splits).
    g.calls = {g.count};
    double best_ms = unsplit_ms;
    Json splits = Json::object();
    for (const int64_t size : {g.count / 2, g.count / 4, int64_t{1}}) {
      if (size < 1 || size == g.count || g.count % size != 0) continue;
      const std::vector<int64_t> split(g.count / size, size);
      MUONPS_ASSIGN_OR_RETURN(const double split_ms, timer->MedianMs([&]() {
        return g.Orthogonalize(*cuda, split, g.best, stream);
      }));
      splits[absl::StrCat(split.size(), "x", size)] = split_ms;
      if (split_ms < best_ms * 0.98) {
        best_ms = split_ms;
        g.calls = split;
      }
    }
    const std::optional<double> torch_ns5 =
        peers.Number("torch_ns5", "ms", g.rows, g.cols, g.count);
    const std::optional<double> torch_gram =
        peers.Number("torch_gram_ns", "ms", g.rows, g.cols, g.count);
    const double tflops = g.Flops(g.best) / best_ms / 1e9;
    Json line;
    line["what"] = "muonps_ns";
    line["rows"] = g.rows;
    line["cols"] = g.cols;
    line["batch"] = g.count;
    line["algorithm"] = std::string(NsAlgorithmName(g.best));
    line["precision"] = precision;
    line["ms"] = best_ms;
    line["calls"] = g.calls;
    line["unsplit_ms"] = unsplit_ms;
    line["split_ms"] = splits;
    line["tflops"] = tflops;
    line["ns5_equiv_tflops"] = g.DenseFlops() / best_ms / 1e9;
    line["ns5_ms"] = ms[0];
    line["gram_ms"] = ms[1];
    line["ns5_tflops"] = g.Flops(NsAlgorithm::kNs5) / ms[0] / 1e9;
    line["gram_tflops"] = g.Flops(NsAlgorithm::kGram) / ms[1] / 1e9;
    line["torch_ns5_ms"] = torch_ns5 ? Json(*torch_ns5) : Json();
    line["speedup_vs_torch_ns5"] = bench::Ratio(torch_ns5, best_ms);
    line["torch_gram_ns_ms"] = torch_gram ? Json(*torch_gram) : Json();
    line["speedup_vs_torch_gram_ns"] = bench::Ratio(torch_gram, best_ms);
    line["fraction_of_gemm_peak"] = tflops / gemm_tflops;
    Print(line);
    matrices += g.count;
    best_flops += g.Flops(g.best);
    dense_flops += g.DenseFlops();
    algorithms[absl::StrCat(g.rows, "x", g.cols)] =
        std::string(NsAlgorithmName(g.best));
    calls[absl::StrCat(g.rows, "x", g.cols)] = g.calls;
  }

  MUONPS_ASSIGN_OR_RETURN(const double all_ms, timer->MedianMs([&]() {
    for (const Group& g : groups) {
      MUONPS_RETURN_IF_ERROR(g.Orthogonalize(*cuda, g.calls, g.best, stream));
    }
    return absl::OkStatus();
  }));
  const std::optional<double> torch_ns5_all =
      peers.Number("torch_ns5_all", "ms");
  const std::optional<double> torch_gram_all =
      peers.Number("torch_gram_ns_all", "ms");
  const double all_tflops = best_flops / all_ms / 1e9;
  Json all;
  all["what"] = "muonps_ns_all";
  all["matrices"] = matrices;
  all["precision"] = precision;
  all["algorithms"] = algorithms;
  all["calls"] = calls;
  all["ms"] = all_ms;
  all["tflops"] = all_tflops;
  all["ns5_equiv_tflops"] = dense_flops / all_ms / 1e9;
  all["torch_ns5_all_ms"] = torch_ns5_all ? Json(*torch_ns5_all) : Json();
  all["speedup_vs_torch_ns5"] = bench::Ratio(torch_ns5_all, all_ms);
  all["torch_gram_ns_all_ms"] = torch_gram_all ? Json(*torch_gram_all) : Json();
  all["speedup_vs_torch_gram_ns"] = bench::Ratio(torch_gram_all, all_ms);
  all["gemm_ceiling_tflops"] = gemm_tflops;
  all["fraction_of_gemm_peak"] = all_tflops / gemm_tflops;
  all["fraction_of_cublas_gemm"] = all_tflops / cublas_tflops;
  all["target_speedup_vs_torch_ns5"] = kTargetSpeedupVsTorchNs5;
  all["target_fraction_of_gemm_peak"] = kTargetFractionOfGemm;
  // The floor: the executed FLOPs at the run's GEMM ceiling.
  all["floor_ms"] = best_flops / gemm_tflops / 1e9;
  all["ratio_to_floor"] = all_ms / (best_flops / gemm_tflops / 1e9);
  all["target_ratio_to_floor"] = kTargetRatioToFloor;
  Print(all);

  MUONPS_ASSIGN_OR_RETURN(const double update_ms, timer->MedianMs([&]() {
    for (const Group& g : groups) {
      int64_t first = 0;
      for (const int64_t n : g.calls) {
        kernels::MuonStack stack;
        stack.names = {absl::StrCat("llama.", g.rows, "x", g.cols)};
        stack.grad = g.Part(g.grad, first, n);
        stack.momentum = g.Part(g.momentum, first, n);
        stack.param = g.Part(g.param, first, n);
        kernels::MuonHyperparameters hyper;
        hyper.lr = 0.02;
        hyper.ns = g.Ns(g.best);
        MUONPS_RETURN_IF_ERROR(cuda->MuonStep(stack, hyper, stream));
        first += n;
      }
    }
    return absl::OkStatus();
  }));
  const std::optional<double> torch_muon =
      peers.Number("torch_muon_step_1gpu", "ms");
  const std::optional<double> adamw = peers.Number("adamw_fused_step", "ms");
  Json update;
  update["what"] = "muonps_update_1gpu";
  update["matrices"] = matrices;
  update["precision"] = precision;
  update["ms"] = update_ms;
  update["ns_all_ms"] = all_ms;
  update["torch_muon_step_ms"] = torch_muon ? Json(*torch_muon) : Json();
  update["ratio_to_torch_muon"] = bench::Ratio(update_ms, torch_muon);
  update["adamw_fused_step_ms"] = adamw ? Json(*adamw) : Json();
  update["ratio_to_adamw_fused"] = bench::Ratio(update_ms, adamw);
  update["target_ratio_to_torch_muon"] = kTargetRatioToTorchMuon;
  Print(update);

  return ops->Synchronize(stream);
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Logs (the kernels' first-use choices among them) go to stderr: stdout
  // carries the JSON lines.
  const absl::Status logging =
      muonps::SetUpLogging({.component = "ns_gpu_bench"});
  if (!logging.ok()) {
    std::fprintf(stderr, "ns_gpu_bench: %s\n", logging.ToString().c_str());
    return 1;
  }
  const absl::Status status = muonps::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "ns_gpu_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
