#include "server/worker/step_engine.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "common/trainer_segment.h"
#include "kernels/cpu/cpu_device_ops.h"
#include "kernels/cpu/cpu_kernels.h"
#include "proto/translate.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// Floats the control messages of a step need in transport memory.
constexpr int64_t kControlFloats = 1024;

}  // namespace

StepBackend CpuStepBackend(absl::Duration timeout) {
  StepBackend backend;
  backend.kernels =
      std::make_unique<kernels::CpuKernels>(kernels::CpuKernelOptions{});
  backend.ops = std::make_unique<kernels::CpuDeviceOps>();
  backend.open_buffers = OpenSharedMemoryBuffers;
  backend.timeout = timeout;
  return backend;
}

StepEngine::StepEngine(std::string worker_id, StepBackend backend,
                       TransportFactory make_transport)
    : worker_id_(std::move(worker_id)),
      make_transport_(std::move(make_transport)),
      device_(backend.ops->device()),
      backend_(std::move(backend)) {}

StepEngine::~StepEngine() {
  absl::MutexLock lock(&mu_);
  // The transport goes before the buffers its pending work may touch.
  DropTransport(absl::CancelledError("the worker is shutting down"));
  trainer_.reset();
}

int64_t StepEngine::last_step() const { return last_step_.load(); }

bool StepEngine::ReleaseTrainerIfGone() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const int64_t pid = trainer_pid_.load();
  if (pid <= 0 || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) {
    return false;
  }
  if (!mu_.TryLock()) return false;  // a step runs: a later call retries
  bool released = false;
  if (trainer_.has_value() && trainer_pid_.load() == pid) {
    DropTransport(absl::CancelledError(
        absl::StrCat("trainer process ", pid, " is gone")));
    trainer_.reset();
    trainer_pid_.store(0);
    released = true;
  }
  mu_.Unlock();
  if (released) {
    spdlog::warn("worker={} trainer process {} is gone: released its buffers",
                 worker_id_, pid);
  }
  return released;
}

absl::StatusOr<ItemSlot> StepEngine::OwnedSlot(const std::string& matrix,
                                               int64_t expert) const {
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    if (plan_.matrices[m].name != matrix) continue;
    if (expert >= 0 && expert < plan_.matrices[m].experts &&
        plan_.slots[m][expert].batch >= 0) {
      return plan_.slots[m][expert];
    }
    return FieldError(
        absl::StatusCode::kNotFound, "matrix",
        absl::StrCat(Quoted(matrix), " expert ", expert,
                     " is not owned by worker ", Quoted(worker_id_)));
  }
  return FieldError(absl::StatusCode::kNotFound, "matrix",
                    absl::StrCat(Quoted(matrix), " is not in the job"));
}

absl::StatusOr<std::vector<float>> StepEngine::Momentum(
    const std::string& matrix, int64_t expert) const {
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(const ItemSlot slot, OwnedSlot(matrix, expert));
  const ComputeBatch& batch = plan_.batches[slot.batch];
  if (!batch.has_momentum[slot.slot]) {
    return FieldError(
        absl::StatusCode::kNotFound, "matrix",
        absl::StrCat(Quoted(matrix), " expert ", expert,
                     " has no momentum on worker ", Quoted(worker_id_)));
  }
  std::vector<float> out(batch.rows * batch.cols);
  kernels::DeviceOps& ops = *backend_.ops;
  MUONPS_RETURN_IF_ERROR(ops.Copy(out.data(), plan_.SlotData(slot, true),
                                  static_cast<int64_t>(out.size()),
                                  ops.stream()));
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  return out;
}

absl::Status StepEngine::SetMomentum(const std::string& matrix, int64_t expert,
                                     std::vector<float> values) {
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(const ItemSlot slot, OwnedSlot(matrix, expert));
  ComputeBatch& batch = plan_.batches[slot.batch];
  if (static_cast<int64_t>(values.size()) != batch.rows * batch.cols) {
    return InvalidField("values",
                        absl::StrCat(values.size(), " floats; the matrix has ",
                                     batch.rows * batch.cols));
  }
  for (float v : values) {
    if (!std::isfinite(v)) return InvalidField("values", "non-finite");
  }
  kernels::DeviceOps& ops = *backend_.ops;
  MUONPS_RETURN_IF_ERROR(ops.Copy(plan_.SlotData(slot, true), values.data(),
                                  static_cast<int64_t>(values.size()),
                                  ops.stream()));
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  batch.has_momentum[slot.slot] = true;
  return absl::OkStatus();
}

absl::Status StepEngine::SetPlan(
    const v1::JobSpec& job, const v1::Plan& plan,
    const std::map<std::string, std::string>& addresses) {
  PlanState next;
  next.job = job;
  next.version = plan.version();
  next.matrices = proto::MatricesFromJob(job);
  next.muon = proto::MuonFromProto(job.muon());
  MUONPS_ASSIGN_OR_RETURN(next.ownership,
                          proto::OwnershipFromPlan(plan, next.matrices));
  for (int r = 0; r < plan.workers_size(); ++r) {
    if (plan.workers(r) == worker_id_) next.rank = r;
    auto it = addresses.find(plan.workers(r));
    next.addresses.push_back(it == addresses.end() ? "" : it->second);
  }
  MUONPS_ASSIGN_OR_RETURN(
      next.schedule,
      scheduler::BuildStepSchedule(
          next.matrices, next.ownership,
          {.bucket_bytes = job.bucket_bytes() > 0 ? job.bucket_bytes()
                                                  : int64_t{64} << 20}));
  const auto algorithms = proto::AlgorithmsOfWorker(plan, worker_id_);
  next.slots.resize(next.matrices.size());
  for (size_t m = 0; m < next.matrices.size(); ++m) {
    next.slots[m].assign(next.matrices[m].experts, ItemSlot{});
  }
  int64_t largest = kControlFloats;
  for (const scheduler::MatrixSpec& spec : next.matrices) {
    largest = std::max(largest, spec.rows * spec.cols);
  }
  // The schedule's stacks this worker owns become its compute batches.
  next.batch_of_stack.assign(next.schedule.stacks.size(), -1);
  for (size_t k = 0; k < next.schedule.stacks.size(); ++k) {
    const scheduler::OwnerStack& stack = next.schedule.stacks[k];
    if (stack.owner != next.rank) continue;
    next.batch_of_stack[k] = static_cast<int>(next.batches.size());
    ComputeBatch batch;
    batch.rows = stack.rows;
    batch.cols = stack.cols;
    auto chosen = algorithms.find(
        {std::min(stack.rows, stack.cols), std::max(stack.rows, stack.cols)});
    batch.algorithm = chosen == algorithms.end() ? kernels::NsAlgorithm::kNs5
                                                 : chosen->second;
    batch.items = stack.items;
    for (size_t slot = 0; slot < stack.items.size(); ++slot) {
      const scheduler::ItemRef& item = stack.items[slot];
      next.slots[item.matrix][item.expert] = {next.batch_of_stack[k],
                                              static_cast<int>(slot)};
    }
    next.batches.push_back(std::move(batch));
  }
  absl::MutexLock lock(&mu_);
  kernels::DeviceOps& ops = *backend_.ops;
  for (ComputeBatch& batch : next.batches) {
    const int64_t floats =
        static_cast<int64_t>(batch.items.size()) * batch.rows * batch.cols;
    MUONPS_ASSIGN_OR_RETURN(batch.staged,
                            ops.Allocate(floats, "staged gradients"));
    MUONPS_ASSIGN_OR_RETURN(batch.momentum, ops.Allocate(floats, "momentum"));
    batch.has_momentum.assign(batch.items.size(), false);
  }
  MUONPS_ASSIGN_OR_RETURN(next.scratch, ops.Allocate(largest, "scratch"));
  // Momentum of items this worker keeps owning moves to the new stacks.
  const bool same_job = plan_.matrices.size() == next.matrices.size();
  for (size_t m = 0; m < next.matrices.size(); ++m) {
    for (int64_t e = 0; e < next.matrices[m].experts; ++e) {
      const ItemSlot& to = next.slots[m][e];
      if (to.batch < 0) continue;
      const bool had = same_job &&
                       e < static_cast<int64_t>(plan_.slots[m].size()) &&
                       plan_.slots[m][e].batch >= 0 &&
                       plan_.batches[plan_.slots[m][e].batch]
                           .has_momentum[plan_.slots[m][e].slot];
      if (had) {
        const ComputeBatch& nb = next.batches[to.batch];
        MUONPS_RETURN_IF_ERROR(ops.Copy(next.SlotData(to, true),
                                        plan_.SlotData(plan_.slots[m][e], true),
                                        nb.rows * nb.cols, ops.stream()));
        next.batches[to.batch].has_momentum[to.slot] = true;
      } else if (last_step_.load() >= 0) {
        ++momentum_resets_;  // an owner change: no checkpoint to restore
      }
    }
  }
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  // The transport of the old version goes first: its pending work may
  // still name the old buffers. Aborted, not finalized: a finalize waits
  // for peers that may be gone.
  DropTransport(absl::CancelledError(
      absl::StrCat("plan version ", next.version, " replaced it")));
  plan_ = std::move(next);
  return absl::OkStatus();
}

absl::Status StepEngine::NoPlanYet() const {
  return FieldError(absl::StatusCode::kFailedPrecondition, "plan",
                    absl::StrCat("worker ", Quoted(worker_id_),
                                 " has no plan yet (or is not in it)"));
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
  TrainerBuffersOpener open;
  {
    absl::MutexLock lock(&mu_);
    open = backend_.open_buffers;
    if (plan_.rank >= 0 &&
        plan_.rank >= static_cast<int>(plan_.ownership.worker_ids.size()) -
                          plan_.ownership.dedicated) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition, "device",
          absl::StrCat("worker ", Quoted(worker_id_),
                       " is dedicated (--dedicated): it takes no trainer; "
                       "attach to the worker of your GPU"));
    }
    // A shared-memory segment is mapped only when it is named for this job
    // and the attaching trainer (common/trainer_segment.h).
    if (!request.segment().empty()) {
      if (plan_.rank < 0) return NoPlanYet();
      MUONPS_RETURN_IF_ERROR(CheckTrainerSegmentName(
          request.segment(), plan_.job.name(), request.trainer_rank(),
          request.trainer_pid()));
    }
  }
  // Mapping is slow (shm_open, cudaIpcOpenMemHandle): outside the lock.
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<TrainerBuffers> buffers,
                          open(request));
  if (buffers->device() != device_) {
    return InvalidField(
        "device",
        absl::StrCat("the trainer lends ", DeviceName(buffers->device()),
                     " memory; worker ", Quoted(worker_id_), " runs on ",
                     DeviceName(device_)));
  }
  absl::MutexLock lock(&mu_);
  if (plan_.rank < 0) return NoPlanYet();
  const int with_trainers =
      static_cast<int>(plan_.ownership.worker_ids.size()) -
      plan_.ownership.dedicated;
  // The data plane pairs every worker but the dedicated ones with one
  // trainer, so a plan with another number of them is one the others have
  // not joined yet: the client retries until they have.
  if (with_trainers != request.trainer_count() ||
      plan_.ownership.dedicated != plan_.job.dedicated_workers()) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan",
        absl::StrCat("plan version ", plan_.version, " has ", with_trainers,
                     " workers with trainers and ", plan_.ownership.dedicated,
                     " dedicated ones; the job has ", request.trainer_count(),
                     " trainers and expects ", plan_.job.dedicated_workers(),
                     " dedicated workers: waiting for the workers to join"));
  }
  std::map<std::string, int> index;
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    index[plan_.matrices[m].name] = static_cast<int>(m);
  }
  AttachedTrainer trainer;
  trainer.rank = request.trainer_rank();
  trainer.count = request.trainer_count();
  trainer.matrices.resize(plan_.matrices.size());
  std::vector<bool> bound(plan_.matrices.size(), false);
  for (const v1::TensorBinding& t : request.tensors()) {
    const std::string field = absl::StrCat("tensor ", Quoted(t.name()));
    const int64_t param_elements =
        t.param_elements() > 0 ? t.param_elements() : t.elements();
    Binding b;
    b.elements = t.elements();
    if (!t.muon()) {
      MUONPS_ASSIGN_OR_RETURN(const LentTensor lent,
                              buffers->Map(t, t.elements(), param_elements));
      b.Lend(lent);
      b.layout =
          proto::LayoutFromProto(t.layout()) == scheduler::Layout::kUnreduced
              ? scheduler::Layout::kUnreduced
              : scheduler::Layout::kReplicated;
      trainer.adamw.emplace_back(t.name(), b);
      continue;
    }
    auto it = index.find(t.name());
    if (it == index.end()) {
      return InvalidField(field, "is not a matrix of the job");
    }
    const scheduler::MatrixSpec& spec = plan_.matrices[it->second];
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
    MUONPS_ASSIGN_OR_RETURN(const LentTensor lent,
                            buffers->Map(t, t.elements(), param_elements));
    b.Lend(lent);
    b.full_param = spec.layout == scheduler::Layout::kRowSharded &&
                   param_elements == full && full != t.elements();
    b.layout = spec.layout;
    trainer.matrices[it->second] = b;
    bound[it->second] = true;
  }
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    if (!bound[m]) {
      return FieldError(absl::StatusCode::kFailedPrecondition,
                        absl::StrCat("matrix ", Quoted(plan_.matrices[m].name)),
                        "is not bound by the trainer");
    }
  }
  std::sort(trainer.adamw.begin(), trainer.adamw.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  MUONPS_RETURN_IF_ERROR(trainer.AllocateWidened(*backend_.ops));
  trainer.buffers = std::move(buffers);
  // A pending transfer may name the old trainer's memory: drop the
  // transport (rebuilt at the next step) before unmapping it.
  DropTransport(absl::CancelledError("a trainer attached"));
  trainer_ = std::move(trainer);
  trainer_pid_.store(request.trainer_pid());
  spdlog::info("worker={} trainer {}/{} attached {} tensors ({})", worker_id_,
               trainer_->rank, trainer_->count, request.tensors_size(),
               DeviceName(device_));
  v1::AttachResponse out;
  out.set_plan_version(plan_.version);
  out.set_rank(plan_.rank);
  return out;
}

void StepEngine::SetDataPlaneSecret(std::string secret) {
  absl::MutexLock lock(&mu_);
  if (secret == data_plane_secret_) return;
  data_plane_secret_ = std::move(secret);
  DropTransport(absl::CancelledError(
      absl::StrCat("worker ", Quoted(worker_id_),
                   " got a new data-plane secret; reconnecting")));
}

void StepEngine::DropTransport(const absl::Status& reason) {
  if (transport_ == nullptr) return;
  transport_->Abort(reason);
  transport_.reset();
}

absl::Status StepEngine::EnsureTransport() {
  if (transport_ != nullptr) return absl::OkStatus();
  for (size_t r = 0; r < plan_.addresses.size(); ++r) {
    if (plan_.addresses[r].empty()) {
      return FieldError(absl::StatusCode::kUnavailable, "plan",
                        absl::StrCat("no data address for rank ", r));
    }
  }
  MUONPS_ASSIGN_OR_RETURN(transport_,
                          make_transport_(plan_.rank, plan_.addresses,
                                          static_cast<uint64_t>(plan_.version),
                                          data_plane_secret_));
  if (transport_->memory() != device_.kind) {
    transport_.reset();
    return absl::InternalError(
        absl::StrCat("worker ", Quoted(worker_id_), " on ", DeviceName(device_),
                     " got a transport for the other kind of memory"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::StepResponse> StepEngine::Step(
    const v1::StepRequest& request) {
  absl::MutexLock lock(&mu_);
  if (request.step_id() < 0) {
    return InvalidField("step_id", absl::StrCat(request.step_id(), " < 0"));
  }
  if (request.step_id() <= last_step_.load()) {
    v1::StepResponse out;
    out.set_step_id(request.step_id());
    out.set_plan_version(plan_.version);
    out.set_already_applied(true);
    return out;
  }
  if (plan_.rank < 0 || !trainer_.has_value()) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "step_id",
                      plan_.rank < 0 ? "the worker is not in the current plan"
                                     : "no trainer buffers are attached");
  }
  MUONPS_RETURN_IF_ERROR(EnsureTransport());
  return RunStep(request, &*trainer_);
}

absl::StatusOr<std::optional<v1::StepResponse>> StepEngine::FollowStep(
    absl::Duration wait) {
  {
    absl::MutexLock lock(&mu_);
    const int size = static_cast<int>(plan_.ownership.worker_ids.size());
    if (plan_.rank >= 0 && plan_.rank >= size - plan_.ownership.dedicated) {
      MUONPS_RETURN_IF_ERROR(EnsureTransport());
      // Rank 0 has a trainer; its first message opens every step.
      const absl::Status opened = transport_->AwaitFrom(0, wait);
      if (absl::IsDeadlineExceeded(opened)) return std::nullopt;
      if (!opened.ok()) {
        DropTransport(opened);
        return opened;
      }
      v1::StepRequest request;  // the step id comes from rank 0
      MUONPS_ASSIGN_OR_RETURN(v1::StepResponse out,
                              RunStep(request, /*trainer=*/nullptr));
      return out;
    }
  }
  absl::SleepFor(wait);  // not a dedicated rank of a plan (yet)
  return std::nullopt;
}

absl::StatusOr<v1::StepResponse> StepEngine::RunStep(
    const v1::StepRequest& request, const AttachedTrainer* trainer) {
  StepRun run(&plan_, trainer, transport_.get(), backend_.ops.get(),
              backend_.kernels.get(), backend_.timeout);
  absl::StatusOr<v1::StepResponse> out = run.Run(request);
  if (!out.ok()) {
    // Rejected steps leave the transport usable; anything else broke it.
    if (out.status().code() != absl::StatusCode::kInvalidArgument) {
      DropTransport(out.status());
      // Transport errors name peer ranks: say whose they are.
      std::string ranks;
      for (size_t r = 0; r < plan_.ownership.worker_ids.size(); ++r) {
        absl::StrAppend(&ranks, r == 0 ? "" : ", ", r, " = ",
                        Quoted(plan_.ownership.worker_ids[r]));
      }
      return Annotate(
          out.status(),
          absl::StrCat(
              "step ",
              trainer == nullptr ? "" : absl::StrCat(request.step_id(), " "),
              "(plan version ", plan_.version, "; ranks ", ranks, ")"));
    }
    return out.status();
  }
  last_step_.store(out->step_id());
  out->set_momentum_reset(momentum_resets_);
  momentum_resets_ = 0;
  return out;
}

}  // namespace worker
}  // namespace muonps
