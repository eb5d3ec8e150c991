// StepEngine's attachment of a trainer: its bindings checked against the
// job and its buffers mapped outside the engine's lock (trainer_binding.h),
// then the trainer replacing the previous one.
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "lending/trainer_segment.h"
#include "server/worker/step_engine.h"
#include "server/worker/trainer_binding.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

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
  transport_.Drop(absl::CancelledError("a trainer attached"));
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
