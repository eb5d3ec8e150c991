// StepEngine's attachment of a trainer: every binding checked against
// the job before anything is mapped, the lent buffers mapped outside the
// engine's lock, then the trainer replacing the previous one.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "lending/trainer_segment.h"
#include "server/worker/step_engine.h"
#include "server/worker/step_protocol.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// a * b * c, or -1 past StepEngine::kMaxLentElements (or overflowing).
int64_t BoundedProduct(int64_t a, int64_t b, int64_t c) {
  int64_t ab = 0, abc = 0;
  if (a < 0 || b < 0 || c < 0 || __builtin_mul_overflow(a, b, &ab) ||
      __builtin_mul_overflow(ab, c, &abc) ||
      abc > StepEngine::kMaxLentElements) {
    return -1;
  }
  return abc;
}

// A tensor that is not a job matrix (the client steps it with AdamW): named
// once, not as a job matrix, of a size every offset computed from stays
// far from overflowing, replicated or unreduced.
absl::Status CheckAdamWBinding(const TensorBinding& t,
                               const std::set<std::string>& matrices,
                               std::set<std::string>* seen) {
  const std::string field = absl::StrCat("tensor ", Quoted(t.name));
  if (t.name.empty()) return InvalidField("tensor name", "is empty");
  if (matrices.count(t.name) != 0) {
    return InvalidField(field, "is a matrix of the job: bind it with muon");
  }
  if (!seen->insert(t.name).second) {
    return InvalidField(field, "is bound twice");
  }
  if (t.elements < 1 || t.elements > StepEngine::kMaxLentElements) {
    return InvalidField(absl::StrCat(field, ".elements"),
                        absl::StrCat(t.elements, " is outside [1, ",
                                     StepEngine::kMaxLentElements, "]"));
  }
  if (t.param_elements != 0 && t.param_elements != t.elements) {
    return InvalidField(
        absl::StrCat(field, ".param_elements"),
        absl::StrCat(t.param_elements, " is neither 0 nor ", t.elements));
  }
  if (t.layout != scheduler::Layout::kReplicated &&
      t.layout != scheduler::Layout::kUnreduced) {
    return InvalidField(absl::StrCat(field, ".layout"),
                        absl::StrCat(scheduler::LayoutName(t.layout),
                                     ": an AdamW tensor is replicated or "
                                     "unreduced"));
  }
  return absl::OkStatus();
}

// The trainer's bindings checked against the job's matrices and mapped
// from `buffers`: every job matrix bound once with the right element
// count, every other tensor by CheckAdamWBinding. INVALID_ARGUMENT naming
// the tensor; FAILED_PRECONDITION naming a job matrix left unbound.
absl::StatusOr<AttachedTrainer> BindTrainer(
    const AttachRequest& request,
    const std::vector<scheduler::MatrixSpec>& matrices,
    TrainerBuffers& buffers) {
  std::map<std::string, int> index;
  std::set<std::string> names, adamw_names;
  for (size_t m = 0; m < matrices.size(); ++m) {
    index[matrices[m].name] = static_cast<int>(m);
    names.insert(matrices[m].name);
  }
  AttachedTrainer trainer;
  trainer.rank = request.trainer_rank;
  trainer.count = request.trainer_count;
  trainer.matrices.resize(matrices.size());
  std::vector<bool> bound(matrices.size(), false);
  for (const TensorBinding& t : request.tensors) {
    const std::string field = absl::StrCat("tensor ", Quoted(t.name));
    Binding b;
    b.elements = t.elements;
    b.group = t.group;
    if (!t.muon) {
      MUONPS_RETURN_IF_ERROR(CheckAdamWBinding(t, names, &adamw_names));
      b.param_elements = t.elements;
      MUONPS_ASSIGN_OR_RETURN(const LentTensor lent,
                              buffers.Map(t, t.elements, t.elements));
      b.Lend(lent);
      b.layout = t.layout;
      trainer.adamw.emplace_back(t.name, b);
      continue;
    }
    auto it = index.find(t.name);
    if (it == index.end()) {
      return InvalidField(field, "is not a matrix of the job");
    }
    const scheduler::MatrixSpec& spec = matrices[it->second];
    const int64_t full = BoundedProduct(spec.rows, spec.cols, spec.experts);
    if (full < 0) {
      return InvalidField(
          field, absl::StrCat("the job's shape is larger than ",
                              StepEngine::kMaxLentElements, " elements"));
    }
    int64_t expected = full;
    if (spec.layout == scheduler::Layout::kRowSharded) {
      const auto [begin, end] = TrainerRowRange(spec.rows, request.trainer_rank,
                                                request.trainer_count);
      expected = (end - begin) * spec.cols * spec.experts;
    }
    if (t.elements != expected || bound[it->second]) {
      return InvalidField(
          field, absl::StrCat("binds ", t.elements, " elements; the job needs ",
                              expected, ", once"));
    }
    const int64_t param_elements =
        t.param_elements > 0 ? t.param_elements : t.elements;
    if (param_elements != t.elements && param_elements != full) {
      return InvalidField(
          field, absl::StrCat("param_elements ", param_elements, " is neither ",
                              t.elements, " nor ", full));
    }
    MUONPS_ASSIGN_OR_RETURN(const LentTensor lent,
                            buffers.Map(t, t.elements, param_elements));
    b.Lend(lent);
    b.param_elements = param_elements;
    b.full_param = spec.layout == scheduler::Layout::kRowSharded &&
                   param_elements == full && full != t.elements;
    b.layout = spec.layout;
    trainer.matrices[it->second] = b;
    bound[it->second] = true;
  }
  for (size_t m = 0; m < matrices.size(); ++m) {
    if (!bound[m]) {
      return FieldError(absl::StatusCode::kFailedPrecondition,
                        absl::StrCat("matrix ", Quoted(matrices[m].name)),
                        "is not bound by the trainer");
    }
  }
  std::sort(trainer.adamw.begin(), trainer.adamw.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<AdamWTensorSpec> specs;
  std::vector<int> matrix_groups;
  for (const auto& [name, b] : trainer.adamw) {
    specs.push_back(
        {name, b.elements, b.layout == scheduler::Layout::kUnreduced, b.group});
    trainer.group_count = std::max(trainer.group_count, b.group + 1);
  }
  for (const Binding& b : trainer.matrices) {
    matrix_groups.push_back(b.group);
    trainer.group_count = std::max(trainer.group_count, b.group + 1);
  }
  trainer.tensors_hash = TensorsHash(specs, matrix_groups);
  return trainer;
}

bool SameMatrices(const std::vector<scheduler::MatrixSpec>& a,
                  const std::vector<scheduler::MatrixSpec>& b) {
  if (a.size() != b.size()) return false;
  for (size_t m = 0; m < a.size(); ++m) {
    if (a[m].name != b[m].name || a[m].rows != b[m].rows ||
        a[m].cols != b[m].cols || a[m].experts != b[m].experts ||
        a[m].layout != b[m].layout) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<AttachResponse> StepEngine::Attach(
    const AttachRequest& request) {
  if (request.trainer_count < 1 || request.trainer_rank < 0 ||
      request.trainer_rank >= request.trainer_count) {
    return InvalidField(
        "trainer_rank",
        absl::StrCat(request.trainer_rank, " of ", request.trainer_count,
                     " is not a valid rank"));
  }
  if (request.trainer_pid < 0) {
    return InvalidField("trainer_pid",
                        absl::StrCat(request.trainer_pid, " < 0"));
  }
  TrainerBuffersOpener open;
  kernels::DeviceOps* ops = nullptr;
  std::vector<scheduler::MatrixSpec> matrices;
  {
    absl::MutexLock lock(&mu_);
    open = backend_.open_buffers;
    ops = backend_.ops.get();
    if (plan_.rank >= 0 && plan_.rank >= plan_.trainers()) {
      return FieldError(
          absl::StatusCode::kFailedPrecondition, "device",
          absl::StrCat("worker ", Quoted(worker_id_),
                       " is dedicated (--dedicated): it takes no trainer; "
                       "attach to the worker of your GPU"));
    }
    if (plan_.rank < 0) return NoPlanYet();
    // A shared-memory segment is mapped only when it is named for this job
    // and the attaching trainer (lending/trainer_segment.h).
    if (!request.segment.empty()) {
      MUONPS_RETURN_IF_ERROR(
          CheckTrainerSegmentName(request.segment, plan_.job.name,
                                  request.trainer_rank, request.trainer_pid));
    }
    matrices = plan_.matrices;
  }
  // Mapping (shm_open, cudaIpcOpenMemHandle), checking every binding and
  // allocating the work buffers are slow: outside the lock, against the
  // job's matrices as they were (checked again below).
  MUONPS_ASSIGN_OR_RETURN(std::unique_ptr<TrainerBuffers> buffers,
                          open(request));
  if (buffers->device() != device_) {
    return InvalidField(
        "device",
        absl::StrCat("the trainer lends ", DeviceName(buffers->device()),
                     " memory; worker ", Quoted(worker_id_), " runs on ",
                     DeviceName(device_)));
  }
  MUONPS_ASSIGN_OR_RETURN(AttachedTrainer trainer,
                          BindTrainer(request, matrices, *buffers));
  // The device ops allocate thread-safely; only their use in a step is
  // ordered by the lock.
  MUONPS_RETURN_IF_ERROR(trainer.AllocateWorkBuffers(*ops));
  trainer.buffers = std::move(buffers);
  absl::MutexLock lock(&mu_);
  if (plan_.rank < 0) return NoPlanYet();
  if (!SameMatrices(plan_.matrices, matrices)) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "plan",
                      "the job was created again while the trainer "
                      "attached: attach again");
  }
  const int with_trainers = plan_.trainers();
  // The data plane pairs every worker but the dedicated ones with one
  // trainer, so a plan with another number of them is one the others have
  // not joined yet: the client retries until they have.
  if (with_trainers != request.trainer_count ||
      plan_.ownership.dedicated != plan_.job.dedicated_workers) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan",
        absl::StrCat("plan version ", plan_.version, " has ", with_trainers,
                     " workers with trainers and ", plan_.ownership.dedicated,
                     " dedicated ones; the job has ", request.trainer_count,
                     " trainers and expects ", plan_.job.dedicated_workers,
                     " dedicated workers: waiting for the workers to join"));
  }
  // A pending transfer may name the old trainer's memory: drop the
  // transport (rebuilt at the next step) before unmapping it, and the step
  // staged for it.
  DropTransport(absl::CancelledError("a trainer attached"));
  if (ledger_.staged.step_id >= 0) {
    spdlog::warn(
        "worker={} step={} staged in doubt: dropped, a trainer "
        "attached",
        worker_id_, ledger_.staged.step_id);
  }
  DropStaged(ledger_, plan_);
  ledger_.means_step = -1;
  trainer_ = std::move(trainer);
  trainer_pid_.store(request.trainer_pid);
  spdlog::info("worker={} trainer {}/{} attached {} tensors ({})", worker_id_,
               trainer_->rank, trainer_->count, request.tensors.size(),
               DeviceName(device_));
  return AttachResponse{plan_.version, plan_.rank};
}

}  // namespace worker
}  // namespace muonps
