// golden_replay: replays PyTorch's golden optimizer trajectories through
// muonps's kernels and prints one JSON line per case, then
// "N passed, M failed". Exits 1 if any case fails, 2 on bad flags, an
// unreadable manifest or a backend that cannot start (--backend cuda on a
// machine without a usable GPU).
#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "common/logging.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "tools/golden_replay/golden_replay.h"
#include "tools/golden_replay/replay_backend.h"

ABSL_FLAG(std::string, golden, "testdata/torch_optim_golden",
          "Folder holding manifest.json and the tensors it names.");
ABSL_FLAG(std::string, algorithm, "ns5", "Newton-Schulz algorithm: ns5|gram.");
ABSL_FLAG(std::string, backend, "cpu", "Kernel backend: cpu|cuda.");
ABSL_FLAG(std::string, precision, "fp32",
          "Newton-Schulz GEMM input precision: fp32|bf16|fp16 (bf16 and "
          "fp16 need --backend cuda); sets the tolerances.");
ABSL_FLAG(int, threads, 0, "OpenBLAS threads (0: all cores; cpu backend).");
ABSL_FLAG(int, device, 0, "CUDA device (cuda backend).");

namespace muonps {
namespace {

int Run() {
  const absl::StatusOr<NsAlgorithm> algorithm =
      ParseNsAlgorithm(absl::GetFlag(FLAGS_algorithm));
  if (!algorithm.ok()) {
    spdlog::error("--algorithm: {}", algorithm.status().ToString());
    return 2;
  }
  golden::BackendFlags flags;
  flags.backend = absl::GetFlag(FLAGS_backend);
  flags.precision = absl::GetFlag(FLAGS_precision);
  flags.threads = absl::GetFlag(FLAGS_threads);
  flags.device = absl::GetFlag(FLAGS_device);
  const absl::StatusOr<golden::Tolerances> tolerances =
      golden::TolerancesFor(flags.precision, *algorithm);
  if (!tolerances.ok()) {
    spdlog::error("--precision: {}", tolerances.status().ToString());
    return 2;
  }
  const absl::StatusOr<golden::GoldenManifest> manifest =
      golden::LoadGoldenManifest(absl::GetFlag(FLAGS_golden));
  if (!manifest.ok()) {
    spdlog::error("--golden: {}", manifest.status().ToString());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<kernels::MuonKernels>> kernels =
      golden::MakeReplayBackend(flags);
  if (!kernels.ok()) {
    spdlog::error("--backend {}: {}", flags.backend,
                  kernels.status().ToString());
    return 2;
  }
  int passed = 0, failed = 0;
  for (const golden::GoldenCase& c : manifest->cases) {
    const absl::StatusOr<golden::CaseResult> result = golden::ReplayCase(
        *manifest, c, *algorithm, kernels->get(), *tolerances);
    if (result.ok()) {
      std::printf("%s\n", golden::ResultJson(
                              *result, NsAlgorithmName(*algorithm),
                              (*kernels)->backend_name(), flags.precision)
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
      "[--backend cpu|cuda] [--precision fp32|bf16|fp16]");
  absl::ParseCommandLine(argc, argv);
  if (!muonps::SetUpLogging({.component = "golden_replay"}).ok()) return 2;
  return muonps::Run();
}
