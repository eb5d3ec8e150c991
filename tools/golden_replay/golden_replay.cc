#include "tools/golden_replay/golden_replay.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace golden {
namespace {

double RelativeError(const std::vector<float>& ours,
                     const std::vector<float>& want) {
  double diff = 0, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(ours[i]) - want[i];
    diff += d * d;
    ref += static_cast<double>(want[i]) * want[i];
  }
  // NaN in ours propagates into diff, and the comparison against the
  // tolerance then fails, as it must.
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

// max that keeps NaN: WorstOf(a, NaN) returns a, which would let a backend
// that produces NaN (or a golden file holding one) pass.
double WorstOf(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::nan("") : std::max(a, b);
}

absl::Status ReplayMuon(const GoldenManifest& m, const GoldenCase& c,
                        NsAlgorithm algorithm, kernels::MuonKernels* kernels,
                        CaseResult* result) {
  const int64_t n = c.elements();
  MUONPS_ASSIGN_OR_RETURN(std::vector<float> param, ReadTensor(m.dir, c.p0, n));
  std::vector<float> momentum(n, 0.0f);
  kernels::MuonHyperparameters hyper = c.muon;
  hyper.ns.algorithm = algorithm;
  double momentum_err = 0;
  for (const GoldenStep& step : c.steps) {
    MUONPS_ASSIGN_OR_RETURN(std::vector<float> grad,
                            ReadTensor(m.dir, step.grad, n));
    kernels::MuonStack stack;
    stack.names = {c.name};
    stack.grad = {grad.data(), c.batch(), c.rows(), c.cols()};
    stack.momentum = {momentum.data(), c.batch(), c.rows(), c.cols()};
    stack.param = {param.data(), c.batch(), c.rows(), c.cols()};
    MUONPS_RETURN_IF_ERROR(kernels->MuonStep(stack, hyper, kHostStream));
    MUONPS_ASSIGN_OR_RETURN(const std::vector<float> want_param,
                            ReadTensor(m.dir, step.param, n));
    MUONPS_ASSIGN_OR_RETURN(const std::vector<float> want_momentum,
                            ReadTensor(m.dir, step.momentum, n));
    result->max_rel_err_param =
        WorstOf(result->max_rel_err_param, RelativeError(param, want_param));
    momentum_err =
        WorstOf(momentum_err, RelativeError(momentum, want_momentum));
  }
  result->max_rel_err_momentum = momentum_err;
  return absl::OkStatus();
}

absl::Status ReplayAdamW(const GoldenManifest& m, const GoldenCase& c,
                         kernels::MuonKernels* kernels, CaseResult* result) {
  const int64_t n = c.elements();
  MUONPS_ASSIGN_OR_RETURN(std::vector<float> param, ReadTensor(m.dir, c.p0, n));
  std::vector<float> exp_avg(n, 0.0f), exp_avg_sq(n, 0.0f);
  int64_t step_count = 0;
  for (const GoldenStep& step : c.steps) {
    MUONPS_ASSIGN_OR_RETURN(const std::vector<float> grad,
                            ReadTensor(m.dir, step.grad, n));
    const kernels::AdamWTensor tensor{
        c.name,         param.data(),      grad.data(),
        exp_avg.data(), exp_avg_sq.data(), n};
    MUONPS_RETURN_IF_ERROR(
        kernels->AdamWStep(tensor, c.adamw, ++step_count, kHostStream));
    MUONPS_ASSIGN_OR_RETURN(const std::vector<float> want,
                            ReadTensor(m.dir, step.param, n));
    result->max_rel_err_param =
        WorstOf(result->max_rel_err_param, RelativeError(param, want));
  }
  return absl::OkStatus();
}

absl::Status ReplayNewtonSchulz(const GoldenManifest& m, const GoldenCase& c,
                                NsAlgorithm algorithm,
                                kernels::MuonKernels* kernels,
                                CaseResult* result) {
  const int64_t n = c.elements();
  MUONPS_ASSIGN_OR_RETURN(std::vector<float> data,
                          ReadTensor(m.dir, c.input, n));
  MUONPS_ASSIGN_OR_RETURN(const std::vector<float> want,
                          ReadTensor(m.dir, c.output, n));
  NewtonSchulzOptions options = c.ns;
  options.algorithm = algorithm;
  const kernels::MatrixStack stack{data.data(), c.batch(), c.rows(), c.cols()};
  MUONPS_RETURN_IF_ERROR(
      kernels->Orthogonalize(stack, stack, options, kHostStream));
  result->max_rel_err_param = RelativeError(data, want);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CaseResult> ReplayCase(const GoldenManifest& manifest,
                                      const GoldenCase& c,
                                      NsAlgorithm algorithm,
                                      kernels::MuonKernels* kernels,
                                      const Tolerances& tolerances) {
  CaseResult result;
  result.name = c.name;
  result.kind = c.kind;
  absl::Status status;
  switch (c.kind) {
    case CaseKind::kMuon:
      result.tolerance = tolerances.muon_param;
      result.tolerance_momentum = tolerances.momentum;
      status = ReplayMuon(manifest, c, algorithm, kernels, &result);
      break;
    case CaseKind::kAdamW:
      result.tolerance = tolerances.adamw_param;
      status = ReplayAdamW(manifest, c, kernels, &result);
      break;
    case CaseKind::kNewtonSchulz:
      result.tolerance = tolerances.ns_output;
      status = ReplayNewtonSchulz(manifest, c, algorithm, kernels, &result);
      break;
  }
  MUONPS_RETURN_IF_ERROR(
      Annotate(status, absl::StrCat("case ", Quoted(c.name))));
  result.ok = result.max_rel_err_param <= result.tolerance &&
              (!result.max_rel_err_momentum.has_value() ||
               *result.max_rel_err_momentum <= *result.tolerance_momentum);
  return result;
}

std::string ResultJson(const CaseResult& result, absl::string_view algorithm,
                       absl::string_view backend, absl::string_view precision) {
  nlohmann::ordered_json line;
  line["case"] = result.name;
  line["kind"] = std::string(CaseKindName(result.kind));
  line["algorithm"] = std::string(algorithm);
  line["backend"] = std::string(backend);
  line["precision"] = std::string(precision);
  line["max_rel_err_param"] = result.max_rel_err_param;
  line["max_rel_err_momentum"] =
      result.max_rel_err_momentum.has_value()
          ? nlohmann::ordered_json(*result.max_rel_err_momentum)
          : nlohmann::ordered_json(nullptr);
  line["tolerance"] = result.tolerance;
  line["tolerance_momentum"] =
      result.tolerance_momentum.has_value()
          ? nlohmann::ordered_json(*result.tolerance_momentum)
          : nlohmann::ordered_json(nullptr);
  line["ok"] = result.ok;
  return line.dump();
}

}  // namespace golden
}  // namespace muonps
