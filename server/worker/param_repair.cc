#include "server/worker/param_repair.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/step_commit.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

absl::Status RepairParameters(const RoundDecision& decision,
                              const PlanState& plan,
                              const AttachedTrainer* trainer,
                              transport::Transport& t, kernels::DeviceOps& ops,
                              StepLedger& ledger, absl::Duration timeout) {
  const bool source = plan.rank == decision.source;
  const bool target = plan.rank == decision.target;
  if (!source && !target) return absl::OkStatus();
  if (trainer == nullptr) {
    return absl::InternalError(
        absl::StrCat("rank ", plan.rank,
                     " has no trainer, and rank 0 chose it for a repair"));
  }
  const int64_t step = decision.committed;
  const Stream stream = ops.stream();
  const int peer = source ? decision.target : decision.source;
  const bool params = decision.params != 0;
  const bool means = decision.means != 0;
  if (target && params) {
    MUONPS_RETURN_IF_ERROR(trainer->buffers->WriteRecord(
        stream, StepRecordWord::kApplying, StepRecordValue(step)));
  }
  for (size_t m = 0; params && m < trainer->matrices.size(); ++m) {
    const Binding& b = trainer->matrices[m];
    MUONPS_RETURN_IF_ERROR(
        source ? t.Send(b.param, b.param_elements, b.dtype, peer, stream)
               : t.Recv(b.param, b.param_elements, b.dtype, peer, stream));
  }
  // The means sit in the source's staging since it committed the step.
  if (means) {
    for (const int i : trainer->unreduced) {
      const Binding& b = trainer->adamw[i].second;
      float* mean = trainer->means->data() + b.staged_at;
      MUONPS_RETURN_IF_ERROR(
          source ? t.Send(mean, b.elements, DType::kFloat32, peer, stream)
                 : t.Recv(mean, b.elements, DType::kFloat32, peer, stream));
    }
  }
  MUONPS_RETURN_IF_ERROR(t.Synchronize(stream, timeout));
  if (source) return absl::OkStatus();
  // The means into the lent gradients, as a commit writes them (the client
  // steps AdamW on them when the retry is answered already_applied).
  if (means) {
    ledger.means_step = step;
    MUONPS_RETURN_IF_ERROR(RedeliverMeans(ledger, step, *trainer, ops));
  }
  if (!params) return absl::OkStatus();
  MUONPS_RETURN_IF_ERROR(trainer->buffers->WriteRecord(
      stream, StepRecordWord::kApplied, StepRecordValue(step)));
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(stream));
  ledger.last_version.store(plan.version);
  ledger.last.store(step);
  ledger.trainer_behind.reset();
  spdlog::warn(
      "step={} plan_version={} rank={}: the trainer's parameters did not "
      "hold the step whole; repaired from rank {}'s trainer",
      step, plan.version, plan.rank, decision.source);
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
