// golden_replay: replays PyTorch's golden optimizer trajectories through
// muonps's kernels and prints one JSON line per case, then
// "N passed, M failed". Exits 1 if any case fails, 2 on bad flags or an
// unreadable manifest.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/logging.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tools/golden_replay/golden_replay.h"

ABSL_FLAG(std::string, golden, "../shared/testdata/torch_optim_golden",
          "Folder holding manifest.json and the tensors it names.");
ABSL_FLAG(std::string, algorithm, "ns5", "Newton-Schulz algorithm: ns5|gram.");
ABSL_FLAG(std::string, backend, "cpu", "Kernel backend: cpu.");
ABSL_FLAG(int, threads, 0, "OpenBLAS threads (0: all cores).");

namespace muonps {
namespace {

int Run() {
  const absl::StatusOr<kernels::NsAlgorithm> algorithm =
      kernels::ParseNsAlgorithm(absl::GetFlag(FLAGS_algorithm));
  if (!algorithm.ok()) {
    spdlog::error("--algorithm: {}", algorithm.status().ToString());
    return 2;
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "cpu") {
    spdlog::error("--backend: \"{}\" is not available in this build (cpu)",
                  backend);
    return 2;
  }
  const absl::StatusOr<golden::GoldenManifest> manifest =
      golden::LoadGoldenManifest(absl::GetFlag(FLAGS_golden));
  if (!manifest.ok()) {
    spdlog::error("--golden: {}", manifest.status().ToString());
    return 2;
  }
  kernels::CpuKernels kernels(
      kernels::CpuKernelOptions{.threads = absl::GetFlag(FLAGS_threads)});
  int passed = 0, failed = 0;
  for (const golden::GoldenCase& c : manifest->cases) {
    const absl::StatusOr<golden::CaseResult> result =
        golden::ReplayCase(*manifest, c, *algorithm, &kernels);
    if (result.ok()) {
      std::printf("%s\n", golden::ResultJson(
                              *result, kernels::NsAlgorithmName(*algorithm),
                              kernels.backend_name())
                              .c_str());
      ++(result->ok ? passed : failed);
      continue;
    }
    nlohmann::ordered_json line;
    line["case"] = c.name;
    line["kind"] = std::string(golden::CaseKindName(c.kind));
    line["error"] = result.status().ToString();
    line["ok"] = false;
    std::printf("%s\n", line.dump().c_str());
    ++failed;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Replays golden PyTorch optimizer trajectories through muonps kernels.\n"
      "Usage: golden_replay --golden DIR [--algorithm ns5|gram] "
      "[--backend cpu]");
  absl::ParseCommandLine(argc, argv);
  if (!muonps::SetUpLogging({.component = "golden_replay"}).ok()) return 2;
  return muonps::Run();
}
