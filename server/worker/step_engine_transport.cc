// StepEngine's transport of a plan version: built before a step (again
// for a new data-plane secret, which SetDataPlaneSecret sets), dropped
// when a step fails on it or a newer plan replaced it, and on every new
// one the momentum handover (momentum_handover.h), with momentum from the
// job's checkpoints for items whose previous owner left. The rest of
// StepEngine is in step_engine.cc and step_engine_*.cc.
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/step_engine.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

void StepEngine::SetDataPlaneSecret(std::string secret) {
  // Not mu_: a step may hold it for the transport's timeout, and the agent
  // calls this from its heartbeat thread when it re-joins. A transport
  // built with another secret is rebuilt at the next step.
  absl::MutexLock lock(&secret_mu_);
  data_plane_secret_ = std::move(secret);
}

void StepEngine::DropTransport(const absl::Status& reason) {
  if (transport_ == nullptr) return;
  {
    // AbortForPlan may be aborting it: it is gone only after that.
    absl::MutexLock lock(&abort_mu_);
    published_transport_ = nullptr;
  }
  transport_->Abort(reason);
  transport_.reset();
}

absl::Status StepEngine::EnsureTransport() {
  std::string secret;
  {
    absl::MutexLock lock(&secret_mu_);
    secret = data_plane_secret_;
  }
  if (transport_ != nullptr && secret != transport_secret_) {
    DropTransport(absl::CancelledError(
        absl::StrCat("worker ", Quoted(worker_id_),
                     " got a new data-plane secret; reconnecting")));
  }
  // A newer plan dropped some of this one's workers: no step of it can
  // finish, so none starts (SetPlan brings the new one).
  if (const absl::Status replaced = PlanReplaced(); !replaced.ok()) {
    DropTransport(replaced);
    return replaced;
  }
  if (!handover_failed_.ok()) return handover_failed_;
  if (transport_ != nullptr) return absl::OkStatus();
  for (size_t r = 0; r < plan_.addresses.size(); ++r) {
    if (plan_.addresses[r].empty()) {
      return FieldError(absl::StatusCode::kUnavailable, "plan",
                        absl::StrCat("no data address for rank ", r));
    }
  }
  MUONPS_ASSIGN_OR_RETURN(
      transport_,
      make_transport_(plan_.rank, plan_.addresses,
                      static_cast<uint64_t>(plan_.version), secret));
  transport_secret_ = secret;
  if (transport_->memory() != device_.kind) {
    transport_.reset();
    return absl::InternalError(
        absl::StrCat("worker ", Quoted(worker_id_), " on ", DeviceName(device_),
                     " got a transport for the other kind of memory"));
  }
  {
    absl::MutexLock lock(&abort_mu_);
    published_transport_ = transport_.get();
  }
  // The plan may have been replaced while the transport was built.
  if (const absl::Status replaced = PlanReplaced(); !replaced.ok()) {
    DropTransport(replaced);
    return replaced;
  }
  return HandOver();
}

absl::Status StepEngine::HandOver() {
  HandoverContext context;
  context.plan = &plan_;
  context.previous = &previous_;
  context.transport = transport_.get();
  context.ops = backend_.ops.get();
  context.last_step = ledger_.last.load();
  context.first = handed_over_version_ != plan_.version;
  context.timeout = backend_.timeout;
  std::vector<std::pair<int, int64_t>> unresolved;
  context.unresolved = &unresolved;
  // The job's checkpoints, read once, when the first lost item asks.
  std::optional<absl::StatusOr<CheckpointCatalog>> catalog;
  context.checkpoint = [&](int matrix, int64_t expert, float* slot,
                           int64_t step) -> absl::Status {
    mu_.AssertHeld();
    const std::string& dir = plan_.job.checkpoint_dir;
    if (dir.empty() || step < 0) {
      return absl::NotFoundError("the job keeps no checkpoints");
    }
    // RestoreMissingMomentum already looked this item up for this step,
    // and no step was committed here since.
    const auto found = item_restores_.find({matrix, expert});
    if (found != item_restores_.end() && found->second.step == step &&
        found->second.committed == ledger_.last.load()) {
      const ItemSlot& held = plan_.slots[matrix][expert];
      if (!found->second.installed) {
        return absl::NotFoundError(found->second.why_not);
      }
      if (plan_.batches[held.batch].has_momentum[held.slot]) {
        return absl::OkStatus();  // the slot holds that step's momentum
      }
    }
    if (!catalog.has_value()) catalog = CheckpointCatalog::Load(dir);
    if (!catalog->ok()) return catalog->status();
    return MomentumFromCheckpoint(**catalog, matrix, expert, slot, step);
  };
  HandoverOutcome outcome;
  const absl::Status status = HandOverMomentum(context, &outcome);
  if (!status.ok() && !outcome.transport_ok) {
    const absl::Status failed =
        Annotate(ExplainReplaced(status, StepRequest(), nullptr),
                 absl::StrCat("worker ", Quoted(worker_id_), " plan version ",
                              plan_.version));
    DropTransport(failed);
    return failed;
  }
  if (!context.first) return status;
  handed_over_version_ = plan_.version;
  if (!status.ok()) {
    handover_failed_ = status;
    lost_items_ = std::move(unresolved);
    spdlog::error("worker={} plan_version={} momentum handover: {}", worker_id_,
                  plan_.version, status.ToString());
    return status;
  }
  momentum_resets_ += outcome.reset;
  momentum_resets_total_ += outcome.reset;
  // Every item owned here now holds momentum as of the job's newest step
  // (handed over, or from a checkpoint of that step): what a restore on
  // start took from an older checkpoint is gone, and so is its rule that
  // the trainer resume from there.
  if (outcome.job_step >= 0) restore_unverified_ = -1;
  if (outcome.lost > 0) {
    spdlog::warn(
        "worker={} plan_version={} momentum handover: {} matrices lost their "
        "previous owner; here {} restored from the checkpoint, {} start from "
        "zero (allow_momentum_reset)",
        worker_id_, plan_.version, outcome.lost, outcome.restored,
        outcome.reset);
  }
  if (outcome.sent > 0 || outcome.received > 0) {
    spdlog::info(
        "worker={} plan_version={} momentum handover: sent {}, received {} "
        "matrices",
        worker_id_, plan_.version, outcome.sent, outcome.received);
  }
  return absl::OkStatus();
}

absl::Status StepEngine::MomentumFromCheckpoint(
    const CheckpointCatalog& catalog, int matrix, int64_t expert, float* slot,
    int64_t step) {
  const scheduler::MatrixSpec& spec = plan_.matrices[matrix];
  std::vector<float> values(spec.rows * spec.cols);
  MUONPS_ASSIGN_OR_RETURN(
      const int64_t as_of,
      catalog.Restore(spec.name, expert, spec.rows, spec.cols, values.data()));
  if (as_of != step) {
    if (restores_ != nullptr) restores_->Increment({"stale"}, 1);
    return absl::NotFoundError(absl::StrCat(
        "the newest checkpoint holding matrix ", Quoted(spec.name), " expert ",
        expert, " is of step ", as_of, "; the job is at step ", step));
  }
  kernels::DeviceOps& ops = *backend_.ops;
  MUONPS_RETURN_IF_ERROR(ops.Copy(
      slot, values.data(), static_cast<int64_t>(values.size()), ops.stream()));
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  if (restores_ != nullptr) restores_->Increment({"restored"}, 1);
  spdlog::info(
      "worker={} plan_version={} momentum of {} expert {} restored from the "
      "checkpoint of step {} (its owner left)",
      worker_id_, plan_.version, Quoted(spec.name), expert, step);
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
