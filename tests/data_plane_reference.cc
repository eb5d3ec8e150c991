// ReferenceModel, the single-process run of the data-plane tests' optimizer
// steps with the CPU kernels, and MaxRelativeError, the measure the tests
// compare the workers' results with it by.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "scheduler/node_exchange.h"
#include "tests/data_plane_fixture.h"

namespace muonps {
namespace testing {
namespace {

using scheduler::Layout;

}  // namespace

double MaxRelativeError(absl::Span<const float> actual,
                        absl::Span<const float> expected) {
  if (actual.size() != expected.size() || expected.empty()) {
    return std::numeric_limits<double>::infinity();
  }
  double squares = 0;
  for (float e : expected) squares += static_cast<double>(e) * e;
  const double rms = std::sqrt(squares / static_cast<double>(expected.size()));
  double worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (!std::isfinite(actual[i])) {
      return std::numeric_limits<double>::infinity();
    }
    const double scale =
        std::max({std::fabs(static_cast<double>(expected[i])), rms, 1e-30});
    worst = std::max(
        worst, std::fabs(static_cast<double>(actual[i]) - expected[i]) / scale);
  }
  return worst;
}

ReferenceModel::ReferenceModel(ModelDecl model, int trainers,
                               AlgorithmMap algorithms)
    : model_(std::move(model)),
      trainers_(trainers),
      algorithms_(std::move(algorithms)) {
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    const int64_t n = m.rows * m.cols * m.options.experts;
    std::vector<float>& param = params_[m.name];
    for (int64_t i = 0; i < n; ++i) param.push_back(InitialParam(t, i));
    momentum_[m.name].assign(n, 0.0f);
    ++t;
  }
  for (const TensorDecl& d : model_.tensors) {
    std::vector<float>& param = params_[d.name];
    for (int64_t i = 0; i < d.elements; ++i) {
      param.push_back(InitialParam(t, i));
    }
    exp_avg_[d.name].assign(d.elements, 0.0f);
    exp_avg_sq_[d.name].assign(d.elements, 0.0f);
    ++t;
  }
}

std::vector<float> ReferenceModel::MeanGradient(int tensor,
                                                int64_t step) const {
  const int matrices = static_cast<int>(model_.matrices.size());
  int64_t n = 0;
  Layout layout = Layout::kReplicated;
  if (tensor < matrices) {
    const MatrixDecl& m = model_.matrices[tensor];
    n = m.rows * m.cols * m.options.experts;
    layout = m.options.layout;
  } else {
    n = model_.tensors[tensor - matrices].elements;
    layout = model_.tensors[tensor - matrices].layout;
  }
  std::vector<float> mean(n, 0.0f);
  if (layout != Layout::kUnreduced) {
    for (int64_t i = 0; i < n; ++i) mean[i] = Gradient(tensor, step, -1, i);
    return mean;
  }
  if (tensor < matrices && !nodes_.empty()) {
    // As the two-level exchange: each node's sum, then across the nodes.
    for (int64_t i = 0; i < n; ++i) {
      mean[i] = scheduler::SumOverNodes(
          nodes_, [&](int32_t r) { return Gradient(tensor, step, r, i); });
    }
  } else {
    // As the workers: an fp32 sum in rank order, times the fp32 inverse.
    for (int r = 0; r < trainers_; ++r) {
      for (int64_t i = 0; i < n; ++i) mean[i] += Gradient(tensor, step, r, i);
    }
  }
  const float inverse = 1.0f / static_cast<float>(trainers_);
  for (float& g : mean) g *= inverse;
  return mean;
}

absl::Status ReferenceModel::Step(int64_t step) {
  int t = 0;
  for (const MatrixDecl& m : model_.matrices) {
    std::vector<float> grad = MeanGradient(t++, step);
    const int64_t size = m.rows * m.cols;
    for (int64_t e = 0; e < m.options.experts; ++e) {
      kernels::MuonHyperparameters hyper = model_.muon;
      auto chosen = algorithms_.find({m.name, e});
      hyper.ns.algorithm =
          chosen == algorithms_.end() ? NsAlgorithm::kNs5 : chosen->second;
      kernels::MuonStack stack;
      stack.names = {m.name};
      stack.grad = {grad.data() + e * size, 1, m.rows, m.cols};
      stack.momentum = {momentum_[m.name].data() + e * size, 1, m.rows, m.cols};
      stack.param = {params_[m.name].data() + e * size, 1, m.rows, m.cols};
      absl::Status status = kernels_.MuonStep(stack, hyper, kHostStream);
      if (!status.ok()) return status;
    }
  }
  ++adamw_steps_;
  for (const TensorDecl& d : model_.tensors) {
    const std::vector<float> grad = MeanGradient(t++, step);
    absl::Status status = kernels_.AdamWStep(
        {d.name, params_[d.name].data(), grad.data(), exp_avg_[d.name].data(),
         exp_avg_sq_[d.name].data(), d.elements},
        model_.adamw, adamw_steps_, kHostStream);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

const std::vector<float>& ReferenceModel::param(const std::string& name) const {
  return params_.at(name);
}

std::vector<float> ReferenceModel::momentum(const std::string& name,
                                            int64_t expert) const {
  for (const MatrixDecl& m : model_.matrices) {
    if (m.name != name) continue;
    const int64_t size = m.rows * m.cols;
    const std::vector<float>& all = momentum_.at(name);
    return std::vector<float>(all.begin() + expert * size,
                              all.begin() + (expert + 1) * size);
  }
  return {};
}

void ReferenceModel::ResetMomentum(const std::string& name, int64_t expert) {
  for (const MatrixDecl& m : model_.matrices) {
    if (m.name != name) continue;
    const int64_t size = m.rows * m.cols;
    std::vector<float>& all = momentum_.at(name);
    std::fill(all.begin() + expert * size, all.begin() + (expert + 1) * size,
              0.0f);
  }
}

}  // namespace testing
}  // namespace muonps
