// MomentumStore's handover on a new transport of the installed version
// (momentum_handover.h runs the messages), with momentum from the job's
// checkpoints for items whose previous owner left, and its bookkeeping:
// the lost items, the resets, and what a restore on start no longer needs.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/momentum_store.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

absl::Status MomentumStore::HandOver(transport::Transport& transport,
                                     kernels::FloatBuffer* control,
                                     int64_t last_committed,
                                     absl::Duration timeout,
                                     bool* transport_ok) {
  HandoverContext context;
  {
    // Both stay in place until the next Install (the device rule).
    absl::MutexLock lock(&mu_);
    context.stacks = stacks_.get();
    context.previous = &previous_;
    context.first = handed_over_version_ != stacks_->version;
  }
  context.control = control;
  context.transport = &transport;
  context.ops = ops_;
  context.last_step = last_committed;
  context.timeout = timeout;
  std::vector<std::pair<int, int64_t>> unresolved;
  context.unresolved = &unresolved;
  // The job's checkpoints, read once, when the first lost item asks.
  std::optional<absl::StatusOr<CheckpointCatalog>> catalog;
  context.checkpoint = [&](int matrix, int64_t expert, float* slot,
                           int64_t step) {
    return MomentumFromCheckpoint(catalog, matrix, expert, slot, step,
                                  last_committed);
  };
  HandoverOutcome outcome;
  const absl::Status status = HandOverMomentum(context, &outcome);
  *transport_ok = outcome.transport_ok;
  if ((!status.ok() && !outcome.transport_ok) || !context.first) {
    return status;
  }
  const int64_t version = context.stacks->version;
  absl::MutexLock lock(&mu_);
  handed_over_version_ = version;
  if (!status.ok()) {
    handover_failed_ = status;
    lost_items_ = std::move(unresolved);
    spdlog::error("worker={} plan_version={} momentum handover: {}", worker_id_,
                  version, status.ToString());
    return status;
  }
  resets_ += outcome.reset;
  resets_total_ += outcome.reset;
  // Every item owned here now holds momentum as of the job's newest step
  // (handed over, or from a checkpoint of that step): what a restore on
  // start took from an older checkpoint is gone, and so is its rule that
  // the trainer resume from there.
  if (outcome.job_step >= 0) checkpoints_.HandedOver();
  if (outcome.lost > 0) {
    spdlog::warn(
        "worker={} plan_version={} momentum handover: {} matrices lost their "
        "previous owner; here {} restored from the checkpoint, {} start from "
        "zero (allow_momentum_reset)",
        worker_id_, version, outcome.lost, outcome.restored, outcome.reset);
  }
  if (outcome.sent > 0 || outcome.received > 0) {
    spdlog::info(
        "worker={} plan_version={} momentum handover: sent {}, received {} "
        "matrices",
        worker_id_, version, outcome.sent, outcome.received);
  }
  return absl::OkStatus();
}

absl::Status MomentumStore::MomentumFromCheckpoint(
    std::optional<absl::StatusOr<CheckpointCatalog>>& catalog, int matrix,
    int64_t expert, float* slot, int64_t step, int64_t last_committed) {
  std::string dir;
  MomentumCheckpoints::Expert lost;
  bool has_momentum = false;
  int64_t version = -1;
  {
    absl::MutexLock lock(&mu_);
    dir = stacks_->checkpoint_dir;
    lost = {matrix, expert, stacks_->matrices[matrix]};
    has_momentum = stacks_->has_momentum(stacks_->slot(matrix, expert));
    version = stacks_->version;
  }
  MUONPS_ASSIGN_OR_RETURN(
      const std::optional<std::vector<float>> values,
      checkpoints_.ForHandover(catalog, dir, lost, step, last_committed,
                               has_momentum));
  if (!values.has_value()) return absl::OkStatus();  // in the slot already
  // `slot` is the handover's to write (the device rule).
  MUONPS_RETURN_IF_ERROR(ops_->Copy(slot, values->data(),
                                    static_cast<int64_t>(values->size()),
                                    ops_->stream()));
  MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
  checkpoints_.HandedOverFromCheckpoint(lost, step, version);
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
