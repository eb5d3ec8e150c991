#include "bench/step_cpu/step_model.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace muonps {
namespace bench {
namespace {

// splitmix64: a counter-based generator, so filling is embarrassingly cheap
// and needs no state shared between ranks or matrices.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in [-scale, scale) from stream `stream`.
void FillUniform(uint64_t stream, float scale, float* out, int64_t elements) {
  const uint64_t base = Mix(stream) << 20;
  for (int64_t i = 0; i < elements; ++i) {
    const double unit =
        static_cast<double>(Mix(base + static_cast<uint64_t>(i)) >> 11) *
        0x1.0p-53;
    out[i] = static_cast<float>((2.0 * unit - 1.0) * scale);
  }
}

}  // namespace

absl::StatusOr<std::vector<StepMatrix>> MlpMatrices(
    const std::vector<int64_t>& widths) {
  if (widths.size() < 2) {
    return InvalidField("widths", "needs at least an input and output width");
  }
  std::vector<StepMatrix> matrices;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    if (widths[i] < 1 || widths[i + 1] < 1) {
      return InvalidField("widths", "every width must be >= 1");
    }
    matrices.push_back({absl::StrCat("mlp.", i, ".weight"), widths[i + 1],
                        widths[i], static_cast<int32_t>(i)});
  }
  return matrices;
}

absl::StatusOr<std::vector<int64_t>> ParseWidths(absl::string_view text) {
  std::vector<int64_t> widths;
  for (absl::string_view w : absl::StrSplit(text, ',')) {
    int64_t width = 0;
    if (!absl::SimpleAtoi(w, &width)) {
      return InvalidField("widths", absl::StrCat(Quoted(text),
                                                 " is not comma-separated "
                                                 "integers"));
    }
    widths.push_back(width);
  }
  return widths;
}

int64_t ParameterCount(const std::vector<StepMatrix>& matrices) {
  int64_t n = 0;
  for (const StepMatrix& m : matrices) n += m.elements();
  return n;
}

kernels::MuonHyperparameters StepMuonHyperparameters() {
  kernels::MuonHyperparameters h;
  h.lr = 0.02;
  h.weight_decay = 0.01;
  h.momentum = 0.95;
  h.nesterov = true;
  h.lr_adjustment = kernels::LrAdjustment::kMatchRmsAdamW;
  h.ns.steps = 5;
  return h;
}

void FillInitialParameters(int matrix, float* out, int64_t elements) {
  FillUniform(static_cast<uint64_t>(matrix), 0.02f, out, elements);
}

void FillGradient(int rank, int matrix, float* out, int64_t elements) {
  FillUniform((uint64_t{1} << 32) + (static_cast<uint64_t>(rank) << 16) +
                  static_cast<uint64_t>(matrix),
              0.01f, out, elements);
}

}  // namespace bench
}  // namespace muonps
