#include "server/worker/step_engine.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

constexpr size_t kProblemBytes = 480;

// What every rank tells rank 0 before a step.
struct StepHeader {
  int64_t step_id;
  int32_t trainer_rank;
  int32_t trainer_count;
  char problem[kProblemBytes];  // "" or why this rank cannot step
};

// Rank 0's answer: go, or the first problem any rank reported.
struct StepDecision {
  int32_t go;
  char problem[kProblemBytes];
};

void CopyProblem(const std::string& text, char* out) {
  std::memset(out, 0, kProblemBytes);
  std::memcpy(out, text.data(), std::min(text.size(), kProblemBytes - 1));
}

std::string ItemKey(const std::string& name, int64_t expert) {
  return absl::StrCat(name, "[", expert, "]");
}

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

// Per-step scratch: staged gradients and updates of this rank's owned
// experts, the trainer rank of every worker rank, and counters.
struct StepEngine::StepContext {
  std::map<std::string, std::vector<float>> staged;  // by item key
  std::vector<int32_t> trainer_rank_of;
  double ns_seconds = 0;
  int64_t bytes = 0;
};

StepEngine::StepEngine(std::string worker_id, TransportFactory make_transport)
    : worker_id_(std::move(worker_id)),
      make_transport_(std::move(make_transport)),
      kernels_(kernels::CpuKernelOptions{}) {}

int64_t StepEngine::last_step() const {
  absl::MutexLock lock(&mu_);
  return last_step_;
}

absl::StatusOr<std::vector<float>> StepEngine::Momentum(
    const std::string& matrix, int64_t expert) const {
  absl::MutexLock lock(&mu_);
  auto it = momentum_.find(ItemKey(matrix, expert));
  if (it == momentum_.end()) {
    return FieldError(
        absl::StatusCode::kNotFound, "matrix",
        absl::StrCat(Quoted(matrix), " expert ", expert,
                     " has no momentum on worker ", Quoted(worker_id_)));
  }
  return it->second;
}

absl::Status StepEngine::SetMomentum(const std::string& matrix, int64_t expert,
                                     std::vector<float> values) {
  absl::MutexLock lock(&mu_);
  for (size_t m = 0; m < matrices_.size(); ++m) {
    const scheduler::MatrixSpec& spec = matrices_[m];
    if (spec.name != matrix) continue;
    if (expert < 0 || expert >= spec.experts ||
        plan_.owners[m][expert] != rank_) {
      return FieldError(
          absl::StatusCode::kNotFound, "matrix",
          absl::StrCat(Quoted(matrix), " expert ", expert,
                       " is not owned by worker ", Quoted(worker_id_)));
    }
    if (static_cast<int64_t>(values.size()) != spec.rows * spec.cols) {
      return InvalidField(
          "values", absl::StrCat(values.size(), " floats; the matrix has ",
                                 spec.rows * spec.cols));
    }
    for (float v : values) {
      if (!std::isfinite(v)) return InvalidField("values", "non-finite");
    }
    momentum_[ItemKey(matrix, expert)] = std::move(values);
    return absl::OkStatus();
  }
  return FieldError(absl::StatusCode::kNotFound, "matrix",
                    absl::StrCat(Quoted(matrix), " is not in the job"));
}

absl::Status StepEngine::SetPlan(
    const v1::JobSpec& job, const v1::Plan& plan,
    const std::map<std::string, std::string>& addresses) {
  std::vector<scheduler::MatrixSpec> matrices;
  std::map<std::string, int> index;
  for (const v1::Matrix& m : job.matrices()) {
    scheduler::MatrixSpec s;
    s.name = m.name();
    s.rows = m.rows();
    s.cols = m.cols();
    s.experts = std::max<int64_t>(1, m.experts());
    s.layer = m.layer();
    s.layout =
        m.layout() == v1::LAYOUT_UNREDUCED     ? scheduler::Layout::kUnreduced
        : m.layout() == v1::LAYOUT_ROW_SHARDED ? scheduler::Layout::kRowSharded
                                               : scheduler::Layout::kReplicated;
    index[s.name] = static_cast<int>(matrices.size());
    matrices.push_back(std::move(s));
  }
  scheduler::OwnershipPlan ownership;
  std::map<std::string, int> rank_of;
  std::vector<std::string> peer_addresses;
  std::map<std::pair<int64_t, int64_t>, kernels::NsAlgorithm> algorithms;
  for (const v1::Batch& batch : plan.batches()) {
    if (batch.worker_id() != worker_id_) continue;
    algorithms[{batch.rows(), batch.cols()}] =
        batch.algorithm() == v1::NS_ALGORITHM_GRAM ? kernels::NsAlgorithm::kGram
                                                   : kernels::NsAlgorithm::kNs5;
  }
  int rank = -1;
  for (int r = 0; r < plan.workers_size(); ++r) {
    ownership.worker_ids.push_back(plan.workers(r));
    rank_of[plan.workers(r)] = r;
    if (plan.workers(r) == worker_id_) rank = r;
    auto it = addresses.find(plan.workers(r));
    peer_addresses.push_back(it == addresses.end() ? "" : it->second);
  }
  ownership.owners.resize(matrices.size());
  for (const scheduler::MatrixSpec& spec : matrices) {
    ownership.matrix_names.push_back(spec.name);
  }
  for (const v1::MatrixPlacement& p : plan.matrices()) {
    auto m = index.find(p.name());
    if (m == index.end()) {
      return absl::InternalError(
          absl::StrCat("plan names unknown matrix ", Quoted(p.name())));
    }
    for (const std::string& owner : p.owners()) {
      ownership.owners[m->second].push_back(rank_of.at(owner));
    }
  }
  MUONPS_ASSIGN_OR_RETURN(
      scheduler::StepSchedule schedule,
      scheduler::BuildStepSchedule(
          matrices, ownership,
          {.bucket_bytes = job.bucket_bytes() > 0 ? job.bucket_bytes()
                                                  : int64_t{64} << 20}));
  absl::MutexLock lock(&mu_);
  // Keep the momentum of experts this rank still owns.
  std::map<std::string, std::vector<float>> kept;
  for (size_t m = 0; m < matrices.size(); ++m) {
    for (size_t e = 0; e < ownership.owners[m].size(); ++e) {
      if (ownership.owners[m][e] != rank) continue;
      const std::string key = ItemKey(matrices[m].name, e);
      auto it = momentum_.find(key);
      if (it != momentum_.end()) {
        kept[key] = std::move(it->second);
      } else if (last_step_ >= 0) {
        ++momentum_resets_;  // an owner change: no checkpoint to restore
      }
    }
  }
  momentum_ = std::move(kept);
  job_ = job;
  plan_version_ = plan.version();
  rank_ = rank;
  addresses_ = std::move(peer_addresses);
  matrices_ = std::move(matrices);
  plan_ = std::move(ownership);
  schedule_ = std::move(schedule);
  algorithms_ = std::move(algorithms);
  // The job's matrices never change, so the trainer's bindings stay valid;
  // only owners (and so the transfers) do.
  transport_.reset();
  return absl::OkStatus();
}

absl::StatusOr<v1::AttachResponse> StepEngine::Attach(
    const v1::AttachRequest& request) {
  if (request.trainer_count() < 1 || request.trainer_rank() < 0 ||
      request.trainer_rank() >= request.trainer_count()) {
    return InvalidField(
        "trainer_rank",
        absl::StrCat(request.trainer_rank(), " of ", request.trainer_count(),
                     " is not a valid rank"));
  }
  MUONPS_ASSIGN_OR_RETURN(
      SharedMemorySegment segment,
      SharedMemorySegment::Open(request.segment(),
                                static_cast<size_t>(request.segment_bytes())));
  absl::MutexLock lock(&mu_);
  if (rank_ < 0) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "plan",
                      absl::StrCat("worker ", Quoted(worker_id_),
                                   " has no plan yet (or is not in it)"));
  }
  std::map<std::string, int> index;
  for (size_t m = 0; m < matrices_.size(); ++m) index[matrices_[m].name] = m;
  std::vector<Binding> bindings(matrices_.size());
  std::vector<bool> bound(matrices_.size(), false);
  std::map<std::string, Binding> adamw;
  char* base = static_cast<char*>(segment.data());
  for (const v1::TensorBinding& t : request.tensors()) {
    const std::string field = absl::StrCat("tensor ", Quoted(t.name()));
    if (t.dtype() != v1::DTYPE_FP32 && t.dtype() != v1::DTYPE_UNSPECIFIED) {
      return FieldError(absl::StatusCode::kUnimplemented, field,
                        "the CPU data plane takes fp32 buffers only");
    }
    const int64_t param_elements =
        t.param_elements() > 0 ? t.param_elements() : t.elements();
    for (const auto& [offset, elements] :
         {std::pair<int64_t, int64_t>{t.grad_offset(), t.elements()},
          {t.param_offset(), param_elements}}) {
      if (elements < 1 || offset < 0 || offset % sizeof(float) != 0 ||
          offset + elements * 4 > request.segment_bytes()) {
        return InvalidField(
            field, absl::StrCat("buffers of ", t.elements(),
                                " floats at offsets ", t.grad_offset(), " and ",
                                t.param_offset(), " do not fit the segment"));
      }
    }
    Binding b;
    b.grad = reinterpret_cast<float*>(base + t.grad_offset());
    b.param = reinterpret_cast<float*>(base + t.param_offset());
    b.elements = t.elements();
    b.layout = t.layout() == v1::LAYOUT_UNREDUCED
                   ? scheduler::Layout::kUnreduced
                   : scheduler::Layout::kReplicated;
    if (!t.muon()) {
      adamw[t.name()] = b;
      continue;
    }
    auto it = index.find(t.name());
    if (it == index.end()) {
      return InvalidField(field, "is not a matrix of the job");
    }
    const scheduler::MatrixSpec& spec = matrices_[it->second];
    int64_t expected = spec.rows * spec.cols * spec.experts;
    if (spec.layout == scheduler::Layout::kRowSharded) {
      const auto [begin, end] = TrainerRowRange(
          spec.rows, request.trainer_rank(), request.trainer_count());
      expected = (end - begin) * spec.cols * spec.experts;
    }
    if (t.elements() != expected || bound[it->second]) {
      return InvalidField(
          field, absl::StrCat("binds ", t.elements(),
                              " elements; the job needs ", expected, ", once"));
    }
    const int64_t full = spec.rows * spec.cols * spec.experts;
    if (param_elements != t.elements() && param_elements != full) {
      return InvalidField(
          field, absl::StrCat("param_elements ", param_elements, " is neither ",
                              t.elements(), " nor ", full));
    }
    b.full_param = spec.layout == scheduler::Layout::kRowSharded &&
                   param_elements == full && full != t.elements();
    b.layout = spec.layout;
    bindings[it->second] = b;
    bound[it->second] = true;
  }
  for (size_t m = 0; m < matrices_.size(); ++m) {
    if (!bound[m]) {
      return FieldError(absl::StatusCode::kFailedPrecondition,
                        absl::StrCat("matrix ", Quoted(matrices_[m].name)),
                        "is not bound by the trainer");
    }
  }
  segment_ = std::move(segment);
  trainer_rank_ = request.trainer_rank();
  trainer_count_ = request.trainer_count();
  matrix_bindings_ = std::move(bindings);
  adamw_bindings_ = std::move(adamw);
  spdlog::info("worker={} trainer {}/{} attached {} tensors", worker_id_,
               trainer_rank_, trainer_count_, request.tensors_size());
  v1::AttachResponse out;
  out.set_plan_version(plan_version_);
  out.set_rank(rank_);
  return out;
}

std::pair<int64_t, int64_t> StepEngine::RowRange(int64_t rows,
                                                 int trainer_rank) const {
  return TrainerRowRange(rows, trainer_rank, trainer_count_);
}

absl::Status StepEngine::EnsureTransport() {
  if (transport_ != nullptr) return absl::OkStatus();
  for (size_t r = 0; r < addresses_.size(); ++r) {
    if (addresses_[r].empty()) {
      return FieldError(absl::StatusCode::kUnavailable, "plan",
                        absl::StrCat("no data address for rank ", r));
    }
  }
  MUONPS_ASSIGN_OR_RETURN(
      transport_,
      make_transport_(rank_, addresses_, static_cast<uint64_t>(plan_version_)));
  return absl::OkStatus();
}

std::string StepEngine::FirstNonFinite() const {
  auto check = [](const std::string& name, const Binding& b) -> std::string {
    for (int64_t i = 0; i < b.elements; ++i) {
      if (!std::isfinite(b.grad[i])) {
        return absl::StrCat("grad of ", Quoted(name), ": element ", i, " is ",
                            std::isnan(b.grad[i]) ? "NaN" : "Inf");
      }
    }
    return "";
  };
  for (size_t m = 0; m < matrices_.size(); ++m) {
    std::string problem = check(matrices_[m].name, matrix_bindings_[m]);
    if (!problem.empty()) return problem;
  }
  for (const auto& [name, b] : adamw_bindings_) {
    std::string problem = check(name, b);
    if (!problem.empty()) return problem;
  }
  return "";
}

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
      if (r > 0) MUONPS_RETURN_IF_ERROR(t.Recv(&h, sizeof(h), r));
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
    MUONPS_RETURN_IF_ERROR(t.Send(&mine, sizeof(mine), 0));
  }
  MUONPS_RETURN_IF_ERROR(t.Broadcast(&decision, sizeof(decision), 0));
  MUONPS_RETURN_IF_ERROR(
      t.Broadcast(step->trainer_rank_of.data(), sizeof(int32_t) * size, 0));
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
          MUONPS_RETURN_IF_ERROR(t.ReduceSum(
              b.grad + e * size, mine ? staged->data() : nullptr, size, owner));
          step->bytes += size * 4;
          break;
        case scheduler::Layout::kRowSharded: {
          const auto [begin, end] = RowRange(spec.rows, trainer_rank_);
          const int64_t local = (end - begin) * spec.cols;
          const float* rows = b.grad + e * local;
          if (!mine) {
            MUONPS_RETURN_IF_ERROR(t.Send(rows, local * 4, owner));
            step->bytes += local * 4;
            break;
          }
          for (int r = 0; r < t.size(); ++r) {
            const auto [rb, re] = RowRange(spec.rows, step->trainer_rank_of[r]);
            float* dst = staged->data() + rb * spec.cols;
            if (r == rank_) {
              std::memcpy(dst, rows, local * 4);
            } else {
              MUONPS_RETURN_IF_ERROR(t.Recv(dst, (re - rb) * spec.cols * 4, r));
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
  const double mu = h.momentum() > 0 ? h.momentum() : 0.95;
  const bool nesterov = h.has_nesterov() ? h.nesterov() : true;
  kernels::NewtonSchulzOptions ns;
  ns.steps = h.ns_steps() > 0 ? h.ns_steps() : 5;
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
                                            (re - rb) * spec.cols * 4, r));
              step->bytes += (re - rb) * spec.cols * 4;
            }
          }
          update += begin * spec.cols;
        } else {
          MUONPS_RETURN_IF_ERROR(t.Recv(update, count * 4, owner));
          step->bytes += count * 4;
        }
      } else {
        count = size;
        param = b.param + e * size;
        MUONPS_RETURN_IF_ERROR(t.Broadcast(update, size * 4, owner));
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
    MUONPS_RETURN_IF_ERROR(t.ReduceSum(b.grad, b.grad, b.elements, 0));
    if (rank_ == 0) {
      for (int64_t i = 0; i < b.elements; ++i) b.grad[i] *= inverse;
    }
    MUONPS_RETURN_IF_ERROR(t.Broadcast(b.grad, b.elements * 4, 0));
    step->bytes += 2 * b.elements * 4;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::StepResponse> StepEngine::Step(
    const v1::StepRequest& request) {
  const auto start = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  v1::StepResponse out;
  out.set_step_id(request.step_id());
  out.set_plan_version(plan_version_);
  if (request.step_id() < 0) {
    return InvalidField("step_id", absl::StrCat(request.step_id(), " < 0"));
  }
  if (request.step_id() <= last_step_) {
    out.set_already_applied(true);
    return out;
  }
  if (rank_ < 0 || !segment_.has_value()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "step_id",
                      rank_ < 0 ? "the worker is not in the current plan"
                                : "no trainer buffers are attached");
  }
  MUONPS_RETURN_IF_ERROR(EnsureTransport());
  StepContext step;
  absl::Status status = AgreeOnStep(request, FirstNonFinite(), &step);
  if (!status.ok()) {
    if (status.code() != absl::StatusCode::kInvalidArgument) transport_.reset();
    return status;
  }
  for (const scheduler::Phase& phase : schedule_.order) {
    const scheduler::Bucket& bucket = schedule_.buckets[phase.bucket];
    status = phase.to_owners ? ToOwners(bucket, &step) : absl::OkStatus();
    if (status.ok() && !phase.to_owners) {
      status = Compute(bucket, &step);
      if (status.ok()) status = FromOwners(bucket, request, &step);
    }
    if (!status.ok()) break;
  }
  if (status.ok()) status = AverageAdamWGradients(&step);
  if (!status.ok()) {
    // A broken peer: the transport is rebuilt for the next step.
    transport_.reset();
    return Annotate(status, absl::StrCat("step ", request.step_id()));
  }
  last_step_ = request.step_id();
  out.set_seconds(Seconds(start));
  out.set_ns_seconds(step.ns_seconds);
  out.set_bytes_moved(step.bytes);
  out.set_momentum_reset(momentum_resets_);
  momentum_resets_ = 0;
  return out;
}

}  // namespace worker
}  // namespace muonps
