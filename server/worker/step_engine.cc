#include "server/worker/step_engine.h"

#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "server/worker/step_internal.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

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
  // The CPU data plane pairs every worker of the plan with one trainer, so
  // a plan with another number of workers is one the others have not
  // joined yet: the client retries until they have.
  if (static_cast<int>(plan_.worker_ids.size()) != request.trainer_count()) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan",
        absl::StrCat("plan version ", plan_version_, " has ",
                     plan_.worker_ids.size(), " workers and the job ",
                     request.trainer_count(),
                     " trainers: waiting for the workers to join"));
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
