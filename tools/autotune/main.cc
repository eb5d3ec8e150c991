// muonps-autotune: measures NS5 and Gram NS on this machine's GPU (or CPU)
// for each shape and batch size, writes the cost table a worker reports
// (scheduler/cost_table.h's format) to --out, and prints one JSON line per
// shape on stdout saying which algorithm wins and which batch sizes are
// faster split into smaller batches. Progress goes to stderr.
//
//   muonps-autotune --backend cuda --precision bf16 --out table.jsonl
//   muonps-autotune --backend cpu --shapes 512x2048 --batches 1,2 --out t
//
// Exits 1 with the error on stderr if anything fails (e.g. no GPU).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_device_ops.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/device_name.h"
#include "kernels/device_ops.h"
#include "tools/autotune/autotune.h"
#include "tools/autotune/cpu_description.h"

ABSL_FLAG(std::string, backend, "cuda", "Kernels to measure: cpu or cuda.");
ABSL_FLAG(std::string, precision, "",
          "cuda: fp32, bf16 or fp16 (default bf16); cpu: fp32 only.");
ABSL_FLAG(std::string, shapes, "4096x4096,1024x4096,14336x4096",
          "Comma-separated ROWSxCOLS (default: the Llama-3-8B shapes; "
          "4096x14336 is the same table entry as 14336x4096).");
ABSL_FLAG(std::string, batches, "1,2,4,8,16", "Batch sizes to measure.");
ABSL_FLAG(std::string, out, "", "Cost table file to write (required).");
ABSL_FLAG(int, repeats, 5, "Timed calls per measurement (median kept).");
ABSL_FLAG(int, warmup, 1, "Untimed calls before the timed ones.");
ABSL_FLAG(double, sustain_seconds, 0.05,
          "Each timed repeat runs calls back to back for about this long "
          "(0: one call).");
ABSL_FLAG(int, threads, 0, "cpu: OpenBLAS threads (0: all cores).");
ABSL_FLAG(int, device, 0, "cuda: GPU index.");

namespace muonps {
namespace {

// The kernels under test, the ops of their device (memory and the stream
// they run on), and what the cost table calls that device.
struct Backend {
  std::unique_ptr<kernels::MuonKernels> kernels;
  std::unique_ptr<kernels::DeviceOps> ops;
  std::string device_name;
  std::string precision;
};

absl::StatusOr<Backend> MakeCpuBackend(const std::string& precision,
                                       int threads) {
  if (!precision.empty() && precision != "fp32") {
    return InvalidField("precision", absl::StrCat(Quoted(precision),
                                                  ": the cpu backend runs "
                                                  "fp32 only"));
  }
  Backend backend;
  backend.kernels = std::make_unique<kernels::CpuKernels>(
      kernels::CpuKernelOptions{.threads = threads});
  backend.ops = std::make_unique<kernels::CpuDeviceOps>();
  backend.device_name = autotune::CpuDescription(threads);
  backend.precision = "fp32";
  return backend;
}

absl::StatusOr<Backend> MakeCudaBackend(const std::string& precision,
                                        int device) {
  kernels::cuda::CudaKernelsOptions options;
  options.device = device;
  if (!precision.empty()) {
    MUONPS_ASSIGN_OR_RETURN(options.precision,
                            kernels::cuda::ParsePrecision(precision));
  }
  Backend backend;
  // The kernels first: they fail cleanly (UNAVAILABLE) with no GPU.
  MUONPS_ASSIGN_OR_RETURN(backend.kernels,
                          kernels::cuda::CudaKernels::Create(options));
  MUONPS_ASSIGN_OR_RETURN(backend.ops,
                          kernels::cuda::CudaDeviceOps::Create(device));
  MUONPS_ASSIGN_OR_RETURN(backend.device_name,
                          kernels::cuda::CudaDeviceName(device));
  backend.precision =
      std::string(kernels::cuda::PrecisionName(options.precision));
  return backend;
}

// Writes `text` to `path` through a temporary file and a rename, so a reader
// never sees half a table.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file << text;
    file.flush();
    if (!file) {
      return FieldError(absl::StatusCode::kUnavailable, "out",
                        absl::StrCat("cannot write ", Quoted(temporary)));
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    return FieldError(absl::StatusCode::kUnavailable, "out",
                      absl::StrCat("cannot rename ", Quoted(temporary), " to ",
                                   Quoted(path)));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return InvalidField("out", "is required");
  autotune::AutotuneOptions options;
  MUONPS_ASSIGN_OR_RETURN(options.shapes,
                          autotune::ParseShapes(absl::GetFlag(FLAGS_shapes)));
  MUONPS_ASSIGN_OR_RETURN(options.batches,
                          autotune::ParseBatches(absl::GetFlag(FLAGS_batches)));
  options.repeats = absl::GetFlag(FLAGS_repeats);
  options.warmup = absl::GetFlag(FLAGS_warmup);
  options.sustain_seconds = absl::GetFlag(FLAGS_sustain_seconds);
  MUONPS_RETURN_IF_ERROR(autotune::ValidateAutotuneOptions(options));

  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  const std::string precision = absl::GetFlag(FLAGS_precision);
  absl::StatusOr<Backend> backend;
  if (backend_name == "cpu") {
    backend = MakeCpuBackend(precision, absl::GetFlag(FLAGS_threads));
  } else if (backend_name == "cuda") {
    backend = MakeCudaBackend(precision, absl::GetFlag(FLAGS_device));
  } else {
    return InvalidField("backend", absl::StrCat(Quoted(backend_name),
                                                " is not one of cpu, cuda"));
  }
  if (!backend.ok()) return backend.status();
  const std::string device_name = backend->device_name;
  std::fprintf(stderr, "autotune: %s backend on %s, %s\n", backend_name.c_str(),
               device_name.c_str(), backend->precision.c_str());

  const autotune::ProgressFn progress = [](absl::string_view line) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  };
  std::vector<autotune::Measurement> all;
  for (const autotune::MatrixShape& shape : options.shapes) {
    MUONPS_ASSIGN_OR_RETURN(
        const std::vector<autotune::Measurement> measurements,
        autotune::MeasureShape(*backend->kernels, *backend->ops, shape, options,
                               progress));
    MUONPS_ASSIGN_OR_RETURN(const autotune::ShapeSummary summary,
                            autotune::Summarize(measurements));
    nlohmann::ordered_json line = autotune::ShapeSummaryJson(summary);
    line["device"] = device_name;
    line["backend"] = backend_name;
    line["precision"] = backend->precision;
    std::printf("%s\n", line.dump().c_str());
    std::fflush(stdout);
    all.insert(all.end(), measurements.begin(), measurements.end());
  }
  MUONPS_ASSIGN_OR_RETURN(const std::string table,
                          autotune::CostTableText(device_name, all));
  MUONPS_RETURN_IF_ERROR(WriteFileAtomically(out, table));
  std::fprintf(stderr, "autotune: wrote %zu measurements to %s\n", all.size(),
               out.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace muonps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // Logs (the kernels' first-use choices among them) go to stderr: stdout
  // carries the JSON lines.
  const absl::Status logging =
      muonps::SetUpLogging({.component = "muonps-autotune"});
  if (!logging.ok()) {
    std::fprintf(stderr, "muonps-autotune: %s\n", logging.ToString().c_str());
    return 1;
  }
  const absl::Status status = muonps::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "muonps-autotune: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
