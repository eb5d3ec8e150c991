// bench/ns_cpu: times NS5 and Gram NS on the CPU backend and prints JSON
// lines with seconds, GFLOP/s and the ratio to OpenBLAS sgemm GFLOP/s
// measured in the same run.
//
// Lines: one "sgemm" peer line, then one "ns_cpu" line per (shape,
// algorithm). `gflops` counts the FLOPs the algorithm executes
// (NsExecutedFlops); `ns5_equiv_gflops` divides dense NS5's FLOPs by the same
// time, so algorithms compare on one scale; `speedup_vs_ns5` is NS5's time
// over this algorithm's for the same shape.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/reference/test_matrices.h"
#include "newton_schulz/flops.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(double, min_seconds, 1.0,
          "Minimum time spent timing each configuration.");
ABSL_FLAG(int, threads, 0, "OpenBLAS threads (0: all cores).");

namespace muonps {
namespace {

// Median seconds of `run` over repetitions filling min_seconds (>= 3 reps),
// after one warm-up call.
double MedianSeconds(const std::function<void()>& run) {
  run();
  const double budget = absl::GetFlag(FLAGS_min_seconds);
  std::vector<double> times;
  double total = 0;
  while (times.size() < 3 || total < budget) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const double t =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    times.push_back(t);
    total += t;
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double SgemmGflops(int64_t n) {
  const std::vector<float> a = kernels::reference::GaussianMatrix(n, n, 1);
  const std::vector<float> b = kernels::reference::GaussianMatrix(n, n, 2);
  std::vector<float> c(n * n);
  const double seconds = MedianSeconds([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  const double gflops = 2.0 * n * n * n / seconds / 1e9;
  nlohmann::ordered_json line;
  line["what"] = "sgemm";
  line["m"] = line["n"] = line["k"] = n;
  line["ms"] = seconds * 1e3;
  line["gflops"] = gflops;
  std::printf("%s\n", line.dump().c_str());
  return gflops;
}

struct Case {
  int64_t batch, rows, cols;
};

void Run() {
  const int threads = absl::GetFlag(FLAGS_threads);
  kernels::CpuKernels kernels(kernels::CpuKernelOptions{.threads = threads});
  const double sgemm = SgemmGflops(1024);
  const Case cases[] = {
      {1, 256, 256}, {1, 256, 1024}, {1, 1024, 256}, {8, 512, 2048}};
  for (const Case& c : cases) {
    std::vector<float> in =
        kernels::reference::GaussianMatrix(c.batch * c.rows, c.cols, 3);
    std::vector<float> out(in.size());
    double ns5_seconds = 0;
    for (const NsAlgorithm algorithm :
         {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
      NewtonSchulzOptions options;
      options.algorithm = algorithm;
      const kernels::MatrixStack in_stack{in.data(), c.batch, c.rows, c.cols};
      const kernels::MatrixStack out_stack{out.data(), c.batch, c.rows, c.cols};
      const double seconds = MedianSeconds([&] {
        (void)kernels.Orthogonalize(in_stack, out_stack, options, kHostStream);
      });
      if (algorithm == NsAlgorithm::kNs5) ns5_seconds = seconds;
      const double executed =
          c.batch * NsExecutedFlops(c.rows, c.cols, options);
      const double dense =
          c.batch * Ns5DenseFlops(c.rows, c.cols, options.steps);
      nlohmann::ordered_json line;
      line["what"] = "ns_cpu";
      line["algorithm"] = std::string(NsAlgorithmName(algorithm));
      line["batch"] = c.batch;
      line["rows"] = c.rows;
      line["cols"] = c.cols;
      line["seconds"] = seconds;
      line["gflops"] = executed / seconds / 1e9;
      line["ns5_equiv_gflops"] = dense / seconds / 1e9;
      line["sgemm_gflops"] = sgemm;
      line["ratio_to_sgemm"] = executed / seconds / 1e9 / sgemm;
      line["speedup_vs_ns5"] = ns5_seconds / seconds;
      line["threads"] = threads;
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
  }
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  muonps::Run();
  return 0;
}
