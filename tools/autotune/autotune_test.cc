#include "tools/autotune/autotune.h"

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "scheduler/cost_table.h"
#include "tools/autotune/cpu_description.h"

namespace muonps {
namespace autotune {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

AutotuneOptions SmallOptions() {
  AutotuneOptions options;
  options.shapes = {{32, 96}, {48, 48}};
  options.batches = {1, 2, 3};
  options.repeats = 2;
  return options;
}

// CPU kernels whose Orthogonalize fails from its `fail_at`-th call on, as
// a GPU's calls do once an earlier launch went wrong.
class FailingKernels final : public kernels::MuonKernels {
 public:
  explicit FailingKernels(int fail_at) : fail_at_(fail_at) {}
  int calls() const { return calls_; }
  absl::string_view backend_name() const override { return "failing"; }
  DType update_dtype() const override { return DType::kFloat32; }
  absl::Status CheckFinite(const kernels::MatrixStack& stack,
                           absl::Span<const std::string> names,
                           Stream stream) override {
    return cpu_.CheckFinite(stack, names, stream);
  }
  absl::Status UpdateMomentum(const kernels::MatrixStack& grad,
                              const kernels::MatrixStack& previous,
                              const kernels::MatrixStack& momentum, double mu,
                              bool nesterov, const kernels::MatrixStack& update,
                              Stream stream) override {
    return cpu_.UpdateMomentum(grad, previous, momentum, mu, nesterov, update,
                               stream);
  }
  absl::Status Orthogonalize(const kernels::MatrixStack& in,
                             const kernels::MatrixStack& out,
                             const NewtonSchulzOptions& options,
                             Stream stream) override {
    if (++calls_ >= fail_at_) {
      return absl::InternalError("cudaErrorIllegalAddress");
    }
    return cpu_.Orthogonalize(in, out, options, stream);
  }
  absl::Status ApplyUpdate(const kernels::MatrixStack& param,
                           const kernels::MatrixStack& update, double lr,
                           double weight_decay,
                           kernels::LrAdjustment adjustment,
                           Stream stream) override {
    return cpu_.ApplyUpdate(param, update, lr, weight_decay, adjustment,
                            stream);
  }
  absl::Status MuonStep(const kernels::MuonStack& stack,
                        const kernels::MuonHyperparameters& hyper,
                        Stream stream) override {
    return cpu_.MuonStep(stack, hyper, stream);
  }
  absl::Status AdamWStep(const kernels::AdamWTensor& tensor,
                         const kernels::AdamWHyperparameters& hyper,
                         int64_t step, Stream stream) override {
    return cpu_.AdamWStep(tensor, hyper, step, stream);
  }

 private:
  kernels::CpuKernels cpu_{kernels::CpuKernelOptions{.threads = 1}};
  const int fail_at_;
  int calls_ = 0;
};

TEST(AutotuneTest, CpuTableParsesAndHoldsEveryShapeAlgorithmAndBatch) {
  const AutotuneOptions options = SmallOptions();
  kernels::CpuKernels cpu(kernels::CpuKernelOptions{.threads = 1});
  kernels::CpuDeviceOps ops;
  std::vector<Measurement> all;
  for (const MatrixShape& shape : options.shapes) {
    absl::StatusOr<std::vector<Measurement>> measured =
        MeasureShape(cpu, ops, shape, options, nullptr);
    ASSERT_TRUE(measured.ok()) << measured.status();
    EXPECT_EQ(measured->size(), 2 * options.batches.size());
    for (const Measurement& m : *measured) EXPECT_GT(m.seconds, 0);
    all.insert(all.end(), measured->begin(), measured->end());
  }
  const std::string device = CpuDescription(1);
  absl::StatusOr<std::string> text = CostTableText(device, all);
  ASSERT_TRUE(text.ok()) << text.status();

  const std::vector<std::string> lines =
      absl::StrSplit(*text, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1 + all.size());
  EXPECT_EQ(lines[0].rfind("{\"device\":", 0), 0u) << lines[0];

  absl::StatusOr<scheduler::CostTable> table =
      scheduler::CostTable::Parse(*text);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->device(), device);
  for (const MatrixShape& shape : options.shapes) {
    for (const NsAlgorithm algorithm :
         {NsAlgorithm::kNs5, NsAlgorithm::kGram}) {
      const scheduler::CostTable::Curve* curve =
          table->Find(shape.rows, shape.cols, algorithm);
      ASSERT_NE(curve, nullptr) << shape.rows << "x" << shape.cols;
      ASSERT_EQ(curve->size(), 3u);
      for (size_t i = 0; i < curve->size(); ++i) {
        EXPECT_EQ((*curve)[i].first, options.batches[i]);
        EXPECT_GT((*curve)[i].second, 0);
      }
    }
  }
}

TEST(AutotuneTest, SummaryOfCpuMeasurementsCoversEveryBatch) {
  AutotuneOptions options = SmallOptions();
  kernels::CpuKernels cpu(kernels::CpuKernelOptions{.threads = 1});
  kernels::CpuDeviceOps ops;
  absl::StatusOr<std::vector<Measurement>> measured =
      MeasureShape(cpu, ops, {64, 16}, options, nullptr);
  ASSERT_TRUE(measured.ok()) << measured.status();
  absl::StatusOr<ShapeSummary> summary = Summarize(*measured);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->batches.size(), 3u);
  for (const ShapeSummary::AtBatch& at : summary->batches) {
    EXPECT_EQ(at.winner, at.gram_seconds < at.ns5_seconds ? NsAlgorithm::kGram
                                                          : NsAlgorithm::kNs5);
  }
  const nlohmann::ordered_json json = ShapeSummaryJson(*summary);
  EXPECT_EQ(json["what"], "autotune_shape");
  EXPECT_EQ(json["rows"], 64);
  EXPECT_EQ(json["batches"].size(), 3u);
  EXPECT_TRUE(json["worth_splitting"].is_array());
}

TEST(AutotuneTest, ProgressReportsEveryMeasurement) {
  AutotuneOptions options = SmallOptions();
  options.batches = {1};
  kernels::CpuKernels cpu(kernels::CpuKernelOptions{.threads = 1});
  kernels::CpuDeviceOps ops;
  std::vector<std::string> lines;
  ASSERT_TRUE(
      MeasureShape(cpu, ops, {16, 32}, options, [&](absl::string_view line) {
        lines.emplace_back(line);
      }).ok());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_THAT(lines[0], HasSubstr("16x32 ns5 batch 1"));
  EXPECT_THAT(lines[1], HasSubstr("16x32 gram batch 1"));
}

TEST(AutotuneTest, ErrorsOfTimedCallsNameTheMeasurement) {
  // Warm-up (1) and the first timed call of 16x32 ns5 batch 1 succeed.
  FailingKernels kernels(/*fail_at=*/3);
  kernels::CpuDeviceOps ops;
  absl::StatusOr<std::vector<Measurement>> measured =
      MeasureShape(kernels, ops, {16, 32}, SmallOptions(), nullptr);
  ASSERT_FALSE(measured.ok());
  EXPECT_EQ(measured.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(measured.status().message(),
              HasSubstr("16x32 ns5 batch 1: cudaErrorIllegalAddress"));
}

TEST(AutotuneTest, RepeatsRunCallsBackToBackForSustainSeconds) {
  // One shape, one batch, both algorithms.
  AutotuneOptions options = SmallOptions();
  options.batches = {1};
  kernels::CpuDeviceOps ops;
  options.sustain_seconds = 0;  // warmup + repeats, one call each
  FailingKernels single(/*fail_at=*/1 << 30);
  ASSERT_TRUE(MeasureShape(single, ops, {16, 32}, options, nullptr).ok());
  EXPECT_EQ(single.calls(), 2 * (options.warmup + options.repeats));
  // A 16 x 32 call takes far less than 20 ms on any CPU: each repeat runs
  // many, after one more untimed call that times one.
  options.sustain_seconds = 0.02;
  FailingKernels sustained(/*fail_at=*/1 << 30);
  ASSERT_TRUE(MeasureShape(sustained, ops, {16, 32}, options, nullptr).ok());
  EXPECT_GT(sustained.calls(), 2 * (options.warmup + 1 + 4 * options.repeats));
}

TEST(AutotuneTest, CpuDescriptionNamesTheThreadCount) {
  EXPECT_FALSE(CpuDescription(0).empty());
  EXPECT_FALSE(absl::StrContains(CpuDescription(0), "threads"));
  EXPECT_TRUE(absl::EndsWith(CpuDescription(3), " (3 threads)"))
      << CpuDescription(3);
}

TEST(AutotuneTest, KernelErrorsPropagate) {
  kernels::CpuKernels cpu(kernels::CpuKernelOptions{.threads = 1});
  kernels::CpuDeviceOps ops;
  AutotuneOptions options = SmallOptions();
  options.ns.eps = -1;
  absl::StatusOr<std::vector<Measurement>> measured =
      MeasureShape(cpu, ops, {16, 32}, options, nullptr);
  ASSERT_FALSE(measured.ok());
  EXPECT_EQ(measured.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(measured.status().message(), HasSubstr("eps"));
}

// The summary splits by the planner's rule (scheduler::BatchSplitter), so
// parts may mix algorithms: batch 3 runs best as Gram on one matrix and NS5
// on two.
TEST(AutotuneTest, SummarySplitsAsThePlannerWouldAndNamesEachPartsAlgorithm) {
  const MatrixShape shape{64, 256};
  std::vector<Measurement> measurements;
  const double ns5[] = {1.0, 1.5, 3.0};
  const double gram[] = {0.8, 1.7, 3.2};
  for (int i = 0; i < 3; ++i) {
    measurements.push_back({shape, NsAlgorithm::kNs5, i + 1, ns5[i]});
    measurements.push_back({shape, NsAlgorithm::kGram, i + 1, gram[i]});
  }
  absl::StatusOr<ShapeSummary> summary = Summarize(measurements);
  ASSERT_TRUE(summary.ok()) << summary.status();
  ASSERT_EQ(summary->worth_splitting.size(), 1u);
  const BatchSplit& split = summary->worth_splitting[0];
  EXPECT_EQ(split.batch, 3);
  EXPECT_THAT(split.parts, ElementsAre(2, 1));
  EXPECT_THAT(split.algorithms,
              ElementsAre(NsAlgorithm::kNs5, NsAlgorithm::kGram));
  EXPECT_DOUBLE_EQ(split.seconds, 3.0);
  EXPECT_DOUBLE_EQ(split.split_seconds, 2.3);
  const nlohmann::ordered_json json = ShapeSummaryJson(*summary);
  ASSERT_EQ(json["worth_splitting"].size(), 1u);
  EXPECT_EQ(json["worth_splitting"][0]["into"],
            nlohmann::ordered_json::parse("[2, 1]"));
  EXPECT_EQ(json["worth_splitting"][0]["algorithms"],
            nlohmann::ordered_json::parse(R"(["ns5", "gram"])"));
  // A measurement taken twice is refused rather than silently overwritten.
  measurements.push_back({shape, NsAlgorithm::kGram, 2, 1.7});
  EXPECT_EQ(Summarize(measurements).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(AutotuneTest, SummaryReportsOnlySplitsThatSaveMoreThanTheMargin) {
  const MatrixShape shape{64, 256};
  std::vector<Measurement> measurements;
  // Best per batch: 1 -> 0.99 (gram), 2 -> 1.9 (ns5; 1+1 at 1.98 loses),
  // 4 -> 5.0 (ns5; 2+2 at 3.8 wins).
  const double ns5[] = {1.0, 1.9, 5.0};
  const double gram[] = {0.99, 2.5, 6.0};
  const int64_t batches[] = {1, 2, 4};
  for (int i = 0; i < 3; ++i) {
    measurements.push_back({shape, NsAlgorithm::kNs5, batches[i], ns5[i]});
    measurements.push_back({shape, NsAlgorithm::kGram, batches[i], gram[i]});
  }
  absl::StatusOr<ShapeSummary> summary = Summarize(measurements);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(summary->winner, NsAlgorithm::kNs5);
  EXPECT_EQ(summary->batches[0].winner, NsAlgorithm::kGram);
  EXPECT_EQ(summary->batches[1].winner, NsAlgorithm::kNs5);
  ASSERT_EQ(summary->worth_splitting.size(), 1u);
  EXPECT_EQ(summary->worth_splitting[0].batch, 4);
  EXPECT_THAT(summary->worth_splitting[0].parts, ElementsAre(2, 2));
  EXPECT_DOUBLE_EQ(summary->worth_splitting[0].split_seconds, 3.8);
}

TEST(AutotuneTest, SummaryRejectsMixedShapesAndMissingAlgorithms) {
  std::vector<Measurement> mixed = {{{8, 8}, NsAlgorithm::kNs5, 1, 1.0},
                                    {{8, 16}, NsAlgorithm::kGram, 1, 1.0}};
  EXPECT_THAT(Summarize(mixed).status().message(), HasSubstr("mix shapes"));
  std::vector<Measurement> lacking = {{{8, 8}, NsAlgorithm::kNs5, 1, 1.0}};
  EXPECT_THAT(Summarize(lacking).status().message(),
              HasSubstr("lacks an algorithm"));
  EXPECT_EQ(Summarize({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AutotuneTest, CostTableTextRejectsAMeasurementTakenTwice) {
  const std::vector<Measurement> twice = {{{8, 16}, NsAlgorithm::kNs5, 1, 1.0},
                                          {{16, 8}, NsAlgorithm::kNs5, 1, 2.0}};
  EXPECT_EQ(CostTableText("cpu", twice).status().code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(AutotuneTest, OptionsRejectShapesEqualUpToOrientationAndBadFields) {
  AutotuneOptions options = SmallOptions();
  EXPECT_TRUE(ValidateAutotuneOptions(options).ok());
  options.shapes = {{14336, 4096}, {4096, 14336}};
  EXPECT_THAT(ValidateAutotuneOptions(options).message(),
              HasSubstr("orientation"));
  options = SmallOptions();
  options.batches = {1, 2, 1};
  EXPECT_THAT(ValidateAutotuneOptions(options).message(),
              HasSubstr("batches: 1 appears twice"));
  options = SmallOptions();
  options.repeats = 0;
  EXPECT_THAT(ValidateAutotuneOptions(options).message(), HasSubstr("repeats"));
  options = SmallOptions();
  options.sustain_seconds = -1;
  EXPECT_THAT(ValidateAutotuneOptions(options).message(),
              HasSubstr("sustain_seconds"));
  options.sustain_seconds = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(ValidateAutotuneOptions(options).message(),
              HasSubstr("sustain_seconds"));
  options = SmallOptions();
  options.ns.steps = 6;
  EXPECT_THAT(ValidateAutotuneOptions(options).message(),
              HasSubstr("ns.steps"));
  options = SmallOptions();
  options.shapes.clear();
  EXPECT_THAT(ValidateAutotuneOptions(options).message(), HasSubstr("shapes"));
}

TEST(AutotuneTest, ParsesShapesAndBatchesAndNamesBadEntries) {
  absl::StatusOr<std::vector<MatrixShape>> shapes =
      ParseShapes("4096x4096, 1024x4096");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  ASSERT_EQ(shapes->size(), 2u);
  EXPECT_EQ((*shapes)[1].rows, 1024);
  EXPECT_EQ((*shapes)[1].cols, 4096);
  EXPECT_THAT(ParseShapes("4096x").status().message(), HasSubstr("shapes"));
  EXPECT_THAT(ParseShapes("4096").status().message(),
              HasSubstr("is not ROWSxCOLS"));
  EXPECT_THAT(ParseShapes("0x5").status().message(), HasSubstr("\"0\""));
  absl::StatusOr<std::vector<int64_t>> batches = ParseBatches("1,2,4,8,16");
  ASSERT_TRUE(batches.ok());
  EXPECT_THAT(*batches, ElementsAre(1, 2, 4, 8, 16));
  EXPECT_THAT(ParseBatches("1,x").status().message(), HasSubstr("batches"));
  EXPECT_EQ(Llama3_8BShapes().size(), 3u);
}

}  // namespace
}  // namespace autotune
}  // namespace muonps
