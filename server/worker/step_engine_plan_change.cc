// StepEngine's way out of a step whose plan was replaced: AbortForPlan,
// called from the agent's watch thread without the step's lock, and what
// the engine's steps answer until the new plan is set.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "server/worker/step_engine.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

bool StepEngine::AbortForPlan(const PlanMembership& next) {
  std::vector<std::string> lost;
  int64_t version = -1;
  bool aborted = false;
  {
    absl::MutexLock lock(&abort_mu_);
    version = published_version_;
    if (version < 0 || next.version <= version ||
        next.version <= replaced_by_) {
      return false;
    }
    for (const std::string& id : published_workers_) {
      if (std::find(next.workers.begin(), next.workers.end(), id) ==
          next.workers.end()) {
        lost.push_back(Quoted(id));
      }
    }
    // Only workers joined: every peer of a step in progress is still there,
    // so it finishes before SetPlan replaces the transport.
    if (lost.empty()) return false;
    replaced_by_ = next.version;
    replaced_why_ = absl::UnavailableError(absl::StrCat(
        "plan version ", version, " replaced by ", next.version, ": ",
        lost.size() == 1 ? "worker " : "workers ", absl::StrJoin(lost, ", "),
        " left the job",
        next.reason.empty() ? "" : absl::StrCat(" (", next.reason, ")")));
    if (published_transport_ != nullptr) {
      // Wakes a step waiting on a lost worker (TCP: its sockets are shut
      // down; NCCL: ncclCommAbort); the step thread destroys the transport.
      published_transport_->Abort(replaced_why_);
      aborted = true;
    }
  }
  spdlog::warn(
      "worker={} plan_version={} replaced by plan_version={}, which drops {}: "
      "{}",
      worker_id_, version, next.version, absl::StrJoin(lost, ", "),
      aborted ? "aborted the transport of any step in progress"
              : "no transport to abort");
  return true;
}

absl::Status StepEngine::PlanReplaced() const {
  absl::MutexLock lock(&abort_mu_);
  if (replaced_by_ <= published_version_) return absl::OkStatus();
  return replaced_why_;
}

absl::Status StepEngine::ExplainReplaced(const absl::Status& failed,
                                         const StepRequest& request,
                                         const AttachedTrainer* trainer) const {
  const absl::Status why = PlanReplaced();
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

void StepEngine::PublishPlan() {
  absl::MutexLock lock(&abort_mu_);
  // Versions went backwards: the job was created again (a coordinator
  // restarted without its state), and the old job's replacement says
  // nothing about this one.
  if (plan_.version < published_version_) {
    replaced_by_ = -1;
    replaced_why_ = absl::OkStatus();
  }
  published_version_ = plan_.version;
  published_workers_ = plan_.ownership.worker_ids;
}

}  // namespace worker
}  // namespace muonps
