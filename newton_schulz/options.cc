#include "newton_schulz/options.h"

#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace {

// Degree-5 Polar Express polynomials, one per iteration, as published by
// Amsel, Persson, Musco and Gower (2025, arXiv:2505.16932), designed for
// singular values in [1e-3, 1]. Past the table the last one repeats.
constexpr std::array<NsCoefficients, 8> kPolarExpressRaw = {{
    {8.28721201814563, -23.595886519098837, 17.300387312530933},
    {4.107059111542203, -2.9478499167379106, 0.5448431082926601},
    {3.9486908534822946, -2.908902115962949, 0.5518191394370137},
    {3.3184196573706015, -2.488488024314874, 0.51004894012372},
    {2.300652019954817, -1.6689039845747493, 0.4188073119525673},
    {1.891301407787398, -1.2679958271945868, 0.37680408948524835},
    {1.8750014808534479, -1.2500016453999487, 0.3750001645474248},
    {1.875, -1.25, 0.375},
}};

// The safety factor s maps p(x) to p(x / s): a / s, b / s^3, c / s^5. It is
// applied to every polynomial but the final fixed point.
constexpr double kPolarExpressSafety = 1.01;

bool Finite(double x) { return std::isfinite(x); }

}  // namespace

absl::StatusOr<NsAlgorithm> ParseNsAlgorithm(absl::string_view name) {
  if (name == "ns5") return NsAlgorithm::kNs5;
  if (name == "gram") return NsAlgorithm::kGram;
  return InvalidField("ns_algorithm",
                      absl::StrCat(Quoted(name), " is not one of ns5, gram"));
}

absl::string_view NsAlgorithmName(NsAlgorithm algorithm) {
  return algorithm == NsAlgorithm::kGram ? "gram" : "ns5";
}

absl::Status ValidateNewtonSchulzOptions(const NewtonSchulzOptions& options) {
  if (options.steps < 1 || options.steps > 100) {
    return InvalidField("ns_steps",
                        absl::StrCat(options.steps, " is not in [1, 100]"));
  }
  if (!(options.eps > 0) || !Finite(options.eps)) {
    return InvalidField(
        "eps", absl::StrCat(options.eps, " must be positive and finite"));
  }
  const NsCoefficients& c = options.coefficients;
  if (!Finite(c.a) || !Finite(c.b) || !Finite(c.c)) {
    return InvalidField("ns_coefficients", "must be finite");
  }
  for (size_t i = 0; i < options.gram_restarts.size(); ++i) {
    const int restart = options.gram_restarts[i];
    // Restarts at or past the last step never happen; only < 1 is wrong.
    if (restart < 1) {
      return InvalidField(absl::StrCat("gram_restarts[", i, "]"),
                          absl::StrCat(restart, " must be >= 1"));
    }
  }
  return absl::OkStatus();
}

NsCoefficients CoefficientsForStep(const NewtonSchulzOptions& options,
                                   int step) {
  if (!options.polar_express) return options.coefficients;
  if (options.aol) ++step;
  const int last = static_cast<int>(kPolarExpressRaw.size()) - 1;
  if (step >= last) return kPolarExpressRaw[last];
  const NsCoefficients& raw = kPolarExpressRaw[step];
  const double s = kPolarExpressSafety;
  return {raw.a / s, raw.b / (s * s * s), raw.c / (s * s * s * s * s)};
}

double NormalizationMargin(const NewtonSchulzOptions& options) {
  return options.polar_express ? 1.02 : 1.0;
}

}  // namespace muonps
