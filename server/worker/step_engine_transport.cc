// StepEngine's use of its PlanTransport: the transport built before a
// step, the momentum handover on every new one (MomentumStore::HandOver),
// and what a step answers once a newer plan replaced its own. The rest of
// StepEngine is in step_engine.cc and step_engine_*.cc.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/step_engine.h"

namespace muonps {
namespace worker {

absl::Status StepEngine::EnsureTransport() {
  bool built = false;
  MUONPS_ASSIGN_OR_RETURN(
      transport::Transport* const transport,
      transport_.Ensure(plan_.rank, plan_.addresses, plan_.version,
                        momentum_.handover_failed(), &built));
  if (!built) return absl::OkStatus();
  bool transport_ok = true;
  const absl::Status status =
      momentum_.HandOver(*transport, plan_.scratch.get(), ledger_.last.load(),
                         backend_.timeout, &transport_ok);
  if (status.ok() || transport_ok) return status;
  const absl::Status failed =
      Annotate(ExplainReplaced(status, StepRequest(), nullptr),
               absl::StrCat("worker ", Quoted(worker_id_), " plan version ",
                            plan_.version));
  transport_.Drop(failed);
  return failed;
}

absl::Status StepEngine::ExplainReplaced(const absl::Status& failed,
                                         const StepRequest& request,
                                         const AttachedTrainer* trainer) const {
  const absl::Status why = transport_.Replaced();
  if (why.ok() || failed.ok()) return failed;
  // The transport's own words (NCCL quotes the abort's reason, TCP says
  // a socket was shut down) follow the reason.
  std::string message =
      absl::StrContains(failed.message(), why.message())
          ? std::string(failed.message())
          : absl::StrCat(why.message(), "; the step's transport was aborted (",
                         failed.message(), ")");
  // Neither committed nor staged in doubt: the step left nothing here. (A
  // rank in doubt, or one that committed, already says so.)
  if (trainer != nullptr && !ledger_.staged.voted &&
      ledger_.last.load() < request.step_id) {
    absl::StrAppend(&message, "; step ", request.step_id,
                    " was not applied on this worker: retry it");
  }
  return absl::Status(failed.code() == absl::StatusCode::kDataLoss
                          ? absl::StatusCode::kDataLoss
                          : why.code(),
                      message);
}

}  // namespace worker
}  // namespace muonps
