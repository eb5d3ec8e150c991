#include "tools/autotune/autotune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/statistics.h"
#include "common/status.h"
#include "scheduler/cost_model.h"
#include "scheduler/cost_table.h"

namespace muonps {
namespace autotune {
namespace {

constexpr NsAlgorithm kAlgorithms[] = {NsAlgorithm::kNs5, NsAlgorithm::kGram};

absl::StatusOr<int64_t> ParseBounded(absl::string_view field,
                                     absl::string_view text, int64_t max) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < 1 || value > max) {
    return InvalidField(
        field,
        absl::StrCat(Quoted(text), " is not an integer in [1, ", max, "]"));
  }
  return value;
}

std::string ShapeName(const MatrixShape& shape) {
  return absl::StrCat(shape.rows, "x", shape.cols);
}

// Uniform values in [-1, 1) from a splitmix64 stream: cheap enough for the
// largest matrices, and never zero-filled.
std::vector<float> RandomMatrix(int64_t count, uint64_t seed) {
  std::vector<float> values(count);
  uint64_t state = seed;
  for (float& v : values) {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v = static_cast<float>(static_cast<double>(z >> 11) * 0x1.0p-52 - 1.0);
  }
  return values;
}

// Fills `batch` matrices of host.size() elements at `device_data`, matrix
// i with `host` rotated by a different offset, so no two are equal. `host`
// must stay valid until the stream is synchronized.
absl::Status FillStack(kernels::DeviceOps& ops, const std::vector<float>& host,
                       int64_t batch, float* device_data) {
  const int64_t size = static_cast<int64_t>(host.size());
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t offset = (i * 4099) % size;
    float* matrix = device_data + i * size;
    MUONPS_RETURN_IF_ERROR(
        ops.Copy(matrix, host.data() + offset, size - offset, ops.stream()));
    if (offset > 0) {
      MUONPS_RETURN_IF_ERROR(ops.Copy(matrix + (size - offset), host.data(),
                                      offset, ops.stream()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<MatrixShape>> ParseShapes(absl::string_view text) {
  std::vector<MatrixShape> shapes;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    const std::vector<absl::string_view> dims = absl::StrSplit(entry, 'x');
    if (dims.size() != 2) {
      return InvalidField("shapes",
                          absl::StrCat(Quoted(entry), " is not ROWSxCOLS"));
    }
    MatrixShape shape;
    MUONPS_ASSIGN_OR_RETURN(shape.rows, ParseBounded("shapes", dims[0], 1e6));
    MUONPS_ASSIGN_OR_RETURN(shape.cols, ParseBounded("shapes", dims[1], 1e6));
    shapes.push_back(shape);
  }
  return shapes;
}

absl::StatusOr<std::vector<int64_t>> ParseBatches(absl::string_view text) {
  std::vector<int64_t> batches;
  for (absl::string_view entry : absl::StrSplit(text, ',')) {
    MUONPS_ASSIGN_OR_RETURN(
        const int64_t batch,
        ParseBounded("batches", absl::StripAsciiWhitespace(entry), 100000));
    batches.push_back(batch);
  }
  return batches;
}

std::vector<MatrixShape> Llama3_8BShapes() {
  return {{4096, 4096}, {1024, 4096}, {14336, 4096}};
}

absl::Status ValidateAutotuneOptions(const AutotuneOptions& options) {
  if (options.shapes.empty()) return InvalidField("shapes", "is empty");
  std::set<std::pair<int64_t, int64_t>> seen;
  for (const MatrixShape& shape : options.shapes) {
    if (shape.rows < 1 || shape.cols < 1) {
      return InvalidField("shapes", absl::StrCat(ShapeName(shape),
                                                 ": dimensions must be >= 1"));
    }
    if (!seen.insert({std::min(shape.rows, shape.cols),
                      std::max(shape.rows, shape.cols)})
             .second) {
      return InvalidField(
          "shapes",
          absl::StrCat(ShapeName(shape),
                       " repeats an earlier shape up to orientation (the cost "
                       "table does not tell orientations apart)"));
    }
  }
  if (options.batches.empty()) return InvalidField("batches", "is empty");
  std::set<int64_t> batches;
  for (const int64_t batch : options.batches) {
    if (batch < 1) return InvalidField("batches", absl::StrCat(batch, " < 1"));
    if (!batches.insert(batch).second) {
      return InvalidField("batches", absl::StrCat(batch, " appears twice"));
    }
  }
  if (options.warmup < 0) {
    return InvalidField("warmup", absl::StrCat(options.warmup, " < 0"));
  }
  if (!(options.sustain_seconds >= 0) || options.sustain_seconds > 10) {
    return InvalidField("sustain_seconds", absl::StrCat(options.sustain_seconds,
                                                        " is not in [0, 10]"));
  }
  if (options.repeats < 1 || options.repeats > 1000) {
    return InvalidField("repeats",
                        absl::StrCat(options.repeats, " is not in [1, 1000]"));
  }
  MUONPS_RETURN_IF_ERROR(
      Annotate(ValidateNewtonSchulzOptions(options.ns), "ns"));
  if (options.ns.steps != 5) {
    return InvalidField(
        "ns.steps",
        absl::StrCat(options.ns.steps, ": the cost table's format fixes 5"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Measurement>> MeasureShape(
    kernels::MuonKernels& kernels, kernels::DeviceOps& ops,
    const MatrixShape& shape, const AutotuneOptions& options,
    const ProgressFn& progress) {
  MUONPS_RETURN_IF_ERROR(ValidateAutotuneOptions(options));
  std::vector<int64_t> batches = options.batches;
  std::sort(batches.begin(), batches.end());
  const int64_t elements = shape.rows * shape.cols;
  const int64_t largest = batches.back();
  const Stream stream = ops.stream();
  MUONPS_ASSIGN_OR_RETURN(
      const std::unique_ptr<kernels::FloatBuffer> in,
      ops.Allocate(largest * elements, "the autotune input stack"));
  MUONPS_ASSIGN_OR_RETURN(
      const std::unique_ptr<kernels::FloatBuffer> out,
      ops.Allocate(largest * elements, "the autotune output stack"));
  const std::vector<float> host =
      RandomMatrix(elements, static_cast<uint64_t>(elements));
  MUONPS_RETURN_IF_ERROR(FillStack(ops, host, largest, in->data()));
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(stream));

  std::vector<Measurement> measurements;
  for (const int64_t batch : batches) {
    const kernels::MatrixStack in_stack{in->data(), batch, shape.rows,
                                        shape.cols};
    const kernels::MatrixStack out_stack{out->data(), batch, shape.rows,
                                         shape.cols};
    for (const NsAlgorithm algorithm : kAlgorithms) {
      NewtonSchulzOptions ns = options.ns;
      ns.algorithm = algorithm;
      const std::string what = absl::StrCat(
          ShapeName(shape), " ", NsAlgorithmName(algorithm), " batch ", batch);
      // `calls` back to back, then a synchronize: seconds per call.
      const auto timed = [&](int64_t calls) -> absl::StatusOr<double> {
        const auto start = std::chrono::steady_clock::now();
        for (int64_t c = 0; c < calls; ++c) {
          MUONPS_RETURN_IF_ERROR(Annotate(
              kernels.Orthogonalize(in_stack, out_stack, ns, stream), what));
        }
        MUONPS_RETURN_IF_ERROR(Annotate(ops.Synchronize(stream), what));
        return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             start)
                   .count() /
               static_cast<double>(calls);
      };
      for (int i = 0; i < options.warmup; ++i) {
        MUONPS_RETURN_IF_ERROR(timed(1).status());
      }
      // A repeat runs enough calls back to back to fill sustain_seconds,
      // as one more untimed call (past the first use's searches) says.
      int64_t calls = 1;
      if (options.sustain_seconds > 0) {
        MUONPS_ASSIGN_OR_RETURN(const double estimate, timed(1));
        calls = std::clamp<int64_t>(
            static_cast<int64_t>(
                std::ceil(options.sustain_seconds / std::max(estimate, 1e-6))),
            1, 10000);
      }
      std::vector<double> times;
      for (int i = 0; i < options.repeats; ++i) {
        MUONPS_ASSIGN_OR_RETURN(const double seconds, timed(calls));
        times.push_back(seconds);
      }
      const double seconds = Median(times);
      measurements.push_back({shape, algorithm, batch, seconds});
      if (progress) {
        progress(absl::StrFormat("autotune: %s: %.3f ms (median of %d)", what,
                                 seconds * 1e3, options.repeats));
      }
    }
  }
  return measurements;
}

absl::StatusOr<std::string> CostTableText(
    absl::string_view device, absl::Span<const Measurement> measurements) {
  scheduler::CostTable table;
  for (const Measurement& m : measurements) {
    MUONPS_RETURN_IF_ERROR(
        table.Add(m.shape.rows, m.shape.cols, m.algorithm, m.batch, m.seconds));
  }
  nlohmann::ordered_json device_line;
  device_line["device"] = std::string(device);
  const std::string text =
      absl::StrCat(device_line.dump(), "\n", table.Serialize());
  MUONPS_RETURN_IF_ERROR(
      Annotate(scheduler::CostTable::Parse(text).status(), "cost table"));
  return text;
}

absl::StatusOr<ShapeSummary> Summarize(
    absl::Span<const Measurement> measurements) {
  if (measurements.empty()) return InvalidField("measurements", "is empty");
  ShapeSummary summary;
  summary.shape = measurements.front().shape;
  // batch -> (ns5 seconds, gram seconds); NaN marks "not measured".
  const double kMissing = std::numeric_limits<double>::quiet_NaN();
  std::map<int64_t, std::pair<double, double>> by_batch;
  for (const Measurement& m : measurements) {
    if (m.shape.rows != summary.shape.rows ||
        m.shape.cols != summary.shape.cols) {
      return InvalidField("measurements",
                          absl::StrCat("mix shapes ", ShapeName(summary.shape),
                                       " and ", ShapeName(m.shape)));
    }
    auto [it, inserted] = by_batch.try_emplace(m.batch, kMissing, kMissing);
    (m.algorithm == NsAlgorithm::kNs5 ? it->second.first : it->second.second) =
        m.seconds;
  }
  double ns5_total = 0;
  double gram_total = 0;
  std::vector<std::pair<int64_t, double>> best;
  for (const auto& [batch, times] : by_batch) {
    if (std::isnan(times.first) || std::isnan(times.second)) {
      return InvalidField("measurements",
                          absl::StrCat(ShapeName(summary.shape), " batch ",
                                       batch, " lacks an algorithm"));
    }
    ShapeSummary::AtBatch at{
        batch, times.first, times.second,
        times.second < times.first ? NsAlgorithm::kGram : NsAlgorithm::kNs5};
    summary.batches.push_back(at);
    ns5_total += times.first;
    gram_total += times.second;
    best.emplace_back(batch, std::min(times.first, times.second));
  }
  summary.winner =
      gram_total < ns5_total ? NsAlgorithm::kGram : NsAlgorithm::kNs5;
  // The planner's own rule, on a cost model of these measurements alone.
  auto table = std::make_shared<scheduler::CostTable>();
  for (const Measurement& m : measurements) {
    MUONPS_RETURN_IF_ERROR(Annotate(
        table->Add(m.shape.rows, m.shape.cols, m.algorithm, m.batch, m.seconds),
        "measurements"));
  }
  const scheduler::CostModel model(table, scheduler::DeviceRates{}, 1.0,
                                   /*ns_steps=*/5);
  scheduler::BatchSplitter splitter(model, summary.shape.rows,
                                    summary.shape.cols,
                                    scheduler::AlgorithmPolicy::kAuto);
  for (const auto& [batch, seconds] : best) {
    const scheduler::BatchParts parts = splitter.Parts(batch);
    if (parts.size() < 2) continue;
    BatchSplit split{batch, {}, {}, seconds, splitter.Seconds(batch)};
    for (const scheduler::BatchPart& part : parts) {
      split.parts.push_back(part.count);
      split.algorithms.push_back(part.algorithm);
    }
    summary.worth_splitting.push_back(std::move(split));
  }
  return summary;
}

nlohmann::ordered_json ShapeSummaryJson(const ShapeSummary& summary) {
  nlohmann::ordered_json line;
  line["what"] = "autotune_shape";
  line["rows"] = summary.shape.rows;
  line["cols"] = summary.shape.cols;
  line["winner"] = std::string(NsAlgorithmName(summary.winner));
  nlohmann::ordered_json batches = nlohmann::ordered_json::array();
  for (const ShapeSummary::AtBatch& at : summary.batches) {
    nlohmann::ordered_json entry;
    entry["batch"] = at.batch;
    entry["ns5_seconds"] = at.ns5_seconds;
    entry["gram_seconds"] = at.gram_seconds;
    entry["winner"] = std::string(NsAlgorithmName(at.winner));
    entry["gram_speedup"] = at.ns5_seconds / at.gram_seconds;
    batches.push_back(entry);
  }
  line["batches"] = batches;
  nlohmann::ordered_json splits = nlohmann::ordered_json::array();
  for (const BatchSplit& split : summary.worth_splitting) {
    nlohmann::ordered_json entry;
    entry["batch"] = split.batch;
    entry["into"] = split.parts;
    nlohmann::ordered_json algorithms = nlohmann::ordered_json::array();
    for (const NsAlgorithm algorithm : split.algorithms) {
      algorithms.push_back(std::string(NsAlgorithmName(algorithm)));
    }
    entry["algorithms"] = algorithms;
    entry["seconds"] = split.seconds;
    entry["split_seconds"] = split.split_seconds;
    entry["speedup"] = split.seconds / split.split_seconds;
    splits.push_back(entry);
  }
  line["worth_splitting"] = splits;
  return line;
}

}  // namespace autotune
}  // namespace muonps
