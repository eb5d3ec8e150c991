// StepEngine's transport of a plan version: built before a step (again
// for a new data-plane secret, which SetDataPlaneSecret sets), dropped
// when a step fails on it or a newer plan replaced it, and on every new
// one the momentum handover (MomentumStore::HandOver). The rest of
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
  MUONPS_RETURN_IF_ERROR(momentum_.handover_failed());
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
  bool transport_ok = true;
  const absl::Status status =
      momentum_.HandOver(*transport_, plan_.scratch.get(), ledger_.last.load(),
                         backend_.timeout, &transport_ok);
  if (status.ok() || transport_ok) return status;
  const absl::Status failed =
      Annotate(ExplainReplaced(status, StepRequest(), nullptr),
               absl::StrCat("worker ", Quoted(worker_id_), " plan version ",
                            plan_.version));
  DropTransport(failed);
  return failed;
}

}  // namespace worker
}  // namespace muonps
