// The collective parts of a step: agreement, gradients to owners, owner
// compute, updates back, AdamW gradient averaging (see step_engine.h).
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "server/worker/step_engine.h"
#include "server/worker/step_internal.h"

namespace muonps {
namespace worker {

absl::Status StepEngine::AgreeOnStep(const v1::StepRequest& request,
                                     const std::string& local_problem,
                                     StepContext* step) {
  transport::Transport& t = *transport_;
  const int size = t.size();
  StepHeader mine{};
  mine.step_id = request.step_id();
  mine.trainer_rank = trainer_rank_;
  mine.trainer_count = trainer_count_;
  CopyProblem(local_problem, mine.problem);
  StepDecision decision{};
  step->trainer_rank_of.assign(size, 0);
  if (rank_ == 0) {
    std::string problem = local_problem;
    std::vector<bool> seen(size, false);
    for (int r = 0; r < size; ++r) {
      StepHeader h = mine;
      if (r > 0) MUONPS_RETURN_IF_ERROR(t.Recv(&h, sizeof(h), r, kHostStream));
      h.problem[kProblemBytes - 1] = 0;
      step->trainer_rank_of[r] = h.trainer_rank;
      if (!problem.empty()) continue;
      if (h.problem[0] != 0) {
        problem = absl::StrCat("worker ", Quoted(plan_.worker_ids[r]), ": ",
                               h.problem);
      } else if (h.step_id != mine.step_id) {
        problem = absl::StrCat(
            "worker ", Quoted(plan_.worker_ids[r]), " is at step ", h.step_id,
            ", worker ", Quoted(plan_.worker_ids[0]), " at ", mine.step_id);
      } else if (h.trainer_count != size || h.trainer_rank < 0 ||
                 h.trainer_rank >= size || seen[h.trainer_rank]) {
        problem = absl::StrCat("every worker needs exactly one trainer of ",
                               size, "; worker ", Quoted(plan_.worker_ids[r]),
                               " has trainer ", h.trainer_rank, " of ",
                               h.trainer_count);
      } else {
        seen[h.trainer_rank] = true;
      }
    }
    decision.go = problem.empty() ? 1 : 0;
    CopyProblem(problem, decision.problem);
  } else {
    MUONPS_RETURN_IF_ERROR(t.Send(&mine, sizeof(mine), 0, kHostStream));
  }
  MUONPS_RETURN_IF_ERROR(
      t.Broadcast(&decision, sizeof(decision), 0, kHostStream));
  MUONPS_RETURN_IF_ERROR(t.Broadcast(step->trainer_rank_of.data(),
                                     sizeof(int32_t) * size, 0, kHostStream));
  step->reduce_order.assign(size, 0);
  for (int r = 0; r < size; ++r) {
    // A permutation once agreed (rank 0 checked it); clamp before that.
    const int32_t trainer = step->trainer_rank_of[r];
    if (trainer >= 0 && trainer < size) step->reduce_order[trainer] = r;
  }
  if (!decision.go) {
    decision.problem[kProblemBytes - 1] = 0;
    return absl::InvalidArgumentError(
        absl::StrCat("step ", request.step_id(),
                     " rejected, nothing was changed: ", decision.problem));
  }
  return absl::OkStatus();
}

absl::Status StepEngine::ToOwners(const scheduler::Bucket& bucket,
                                  StepContext* step) {
  transport::Transport& t = *transport_;
  MUONPS_RETURN_IF_ERROR(t.GroupStart());
  for (int32_t m : bucket.matrices) {
    const scheduler::MatrixSpec& spec = matrices_[m];
    const Binding& b = matrix_bindings_[m];
    const int64_t size = spec.rows * spec.cols;
    for (int64_t e = 0; e < spec.experts; ++e) {
      const int owner = plan_.owners[m][e];
      const bool mine = owner == rank_;
      std::vector<float>* staged = nullptr;
      if (mine) {
        staged = &step->staged[ItemKey(spec.name, e)];
        staged->assign(size, 0.0f);
      }
      switch (spec.layout) {
        case scheduler::Layout::kReplicated:
          if (mine) std::memcpy(staged->data(), b.grad + e * size, size * 4);
          break;
        case scheduler::Layout::kUnreduced:
          MUONPS_RETURN_IF_ERROR(
              t.ReduceSum(b.grad + e * size, mine ? staged->data() : nullptr,
                          size, owner, step->reduce_order, kHostStream));
          step->bytes += size * 4;
          break;
        case scheduler::Layout::kRowSharded: {
          const auto [begin, end] = RowRange(spec.rows, trainer_rank_);
          const int64_t local = (end - begin) * spec.cols;
          const float* rows = b.grad + e * local;
          if (!mine) {
            MUONPS_RETURN_IF_ERROR(t.Send(rows, local * 4, owner, kHostStream));
            step->bytes += local * 4;
            break;
          }
          for (int r = 0; r < t.size(); ++r) {
            const auto [rb, re] = RowRange(spec.rows, step->trainer_rank_of[r]);
            float* dst = staged->data() + rb * spec.cols;
            if (r == rank_) {
              std::memcpy(dst, rows, local * 4);
            } else {
              MUONPS_RETURN_IF_ERROR(
                  t.Recv(dst, (re - rb) * spec.cols * 4, r, kHostStream));
              step->bytes += (re - rb) * spec.cols * 4;
            }
          }
          break;
        }
      }
    }
  }
  return t.GroupEnd();
}

absl::Status StepEngine::Compute(const scheduler::Bucket& bucket,
                                 StepContext* step) {
  const v1::MuonHyperparameters& h = job_.muon();
  const double mu = h.has_momentum() ? h.momentum() : 0.95;
  const bool nesterov = h.has_nesterov() ? h.nesterov() : true;
  kernels::NewtonSchulzOptions ns;
  ns.steps = h.ns_steps() > 0 ? h.ns_steps() : 5;
  ns.polar_express = h.polar_express();
  if (h.ns_eps() > 0) ns.eps = h.ns_eps();
  if (h.ns_coefficients_size() == 3) {
    ns.coefficients = {h.ns_coefficients(0), h.ns_coefficients(1),
                       h.ns_coefficients(2)};
  }
  const auto start = std::chrono::steady_clock::now();
  for (int32_t m : bucket.matrices) {
    const scheduler::MatrixSpec& spec = matrices_[m];
    for (int64_t e = 0; e < spec.experts; ++e) {
      if (plan_.owners[m][e] != rank_) continue;
      std::vector<float>& staged = step->staged[ItemKey(spec.name, e)];
      if (spec.layout == scheduler::Layout::kUnreduced) {
        const float scale = 1.0f / static_cast<float>(trainer_count_);
        for (float& v : staged) v *= scale;  // the mean, as DDP
      }
      std::vector<float>& momentum = momentum_[ItemKey(spec.name, e)];
      if (momentum.empty()) momentum.assign(staged.size(), 0.0f);
      const kernels::MatrixStack grad{staged.data(), 1, spec.rows, spec.cols};
      const kernels::MatrixStack buf{momentum.data(), 1, spec.rows, spec.cols};
      // The update overwrites the staged gradient (allowed to alias).
      MUONPS_RETURN_IF_ERROR(
          kernels_.UpdateMomentum(grad, buf, mu, nesterov, grad));
      // The plan picked the algorithm per batch (shape) of this worker.
      auto chosen = algorithms_.find(
          {std::min(spec.rows, spec.cols), std::max(spec.rows, spec.cols)});
      ns.algorithm = chosen == algorithms_.end() ? kernels::NsAlgorithm::kNs5
                                                 : chosen->second;
      MUONPS_RETURN_IF_ERROR(kernels_.Orthogonalize(grad, grad, ns));
    }
  }
  step->ns_seconds += Seconds(start);
  return absl::OkStatus();
}

absl::Status StepEngine::FromOwners(const scheduler::Bucket& bucket,
                                    const v1::StepRequest& request,
                                    StepContext* step) {
  transport::Transport& t = *transport_;
  const v1::MuonHyperparameters& h = job_.muon();
  const kernels::LrAdjustment adjustment =
      h.adjust_lr_fn() == v1::LR_ADJUSTMENT_MATCH_RMS_ADAMW
          ? kernels::LrAdjustment::kMatchRmsAdamW
          : kernels::LrAdjustment::kOriginal;
  for (int32_t m : bucket.matrices) {
    const scheduler::MatrixSpec& spec = matrices_[m];
    const Binding& b = matrix_bindings_[m];
    double lr = request.lr() >= 0 ? request.lr() : h.lr();
    double wd =
        request.weight_decay() >= 0 ? request.weight_decay() : h.weight_decay();
    for (const v1::ParamGroup& g : request.groups()) {
      for (const std::string& name : g.matrices()) {
        if (name == spec.name) {
          lr = g.lr();
          wd = g.weight_decay();
        }
      }
    }
    // Step size from the whole matrix's shape, even for a row shard.
    const float decay = static_cast<float>(1.0 - lr * wd);
    const float scale = static_cast<float>(
        -kernels::AdjustedLr(lr, adjustment, spec.rows, spec.cols));
    const int64_t size = spec.rows * spec.cols;
    for (int64_t e = 0; e < spec.experts; ++e) {
      const int owner = plan_.owners[m][e];
      std::vector<float> received;
      float* update = nullptr;
      if (owner == rank_) {
        update = step->staged[ItemKey(spec.name, e)].data();
      } else {
        received.resize(size);
        update = received.data();
      }
      float* param = nullptr;
      int64_t count = 0;
      if (spec.layout == scheduler::Layout::kRowSharded && !b.full_param) {
        const auto [begin, end] = RowRange(spec.rows, trainer_rank_);
        count = (end - begin) * spec.cols;
        param = b.param + e * count;
        if (owner == rank_) {
          for (int r = 0; r < t.size(); ++r) {
            const auto [rb, re] = RowRange(spec.rows, step->trainer_rank_of[r]);
            if (r != rank_) {
              MUONPS_RETURN_IF_ERROR(t.Send(update + rb * spec.cols,
                                            (re - rb) * spec.cols * 4, r,
                                            kHostStream));
              step->bytes += (re - rb) * spec.cols * 4;
            }
          }
          update += begin * spec.cols;
        } else {
          MUONPS_RETURN_IF_ERROR(t.Recv(update, count * 4, owner, kHostStream));
          step->bytes += count * 4;
        }
      } else {
        count = size;
        param = b.param + e * size;
        MUONPS_RETURN_IF_ERROR(
            t.Broadcast(update, size * 4, owner, kHostStream));
        step->bytes += size * 4;
      }
      for (int64_t i = 0; i < count; ++i) {
        param[i] = param[i] * decay + scale * update[i];
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StepEngine::AverageAdamWGradients(StepContext* step) {
  transport::Transport& t = *transport_;
  const float inverse = 1.0f / static_cast<float>(trainer_count_);
  for (auto& [name, b] : adamw_bindings_) {
    if (b.layout != scheduler::Layout::kUnreduced) continue;
    MUONPS_RETURN_IF_ERROR(t.ReduceSum(b.grad, b.grad, b.elements, 0,
                                       step->reduce_order, kHostStream));
    if (rank_ == 0) {
      for (int64_t i = 0; i < b.elements; ++i) b.grad[i] *= inverse;
    }
    MUONPS_RETURN_IF_ERROR(t.Broadcast(b.grad, b.elements * 4, 0, kHostStream));
    step->bytes += 2 * b.elements * 4;
  }
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
