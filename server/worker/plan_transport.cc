#include "server/worker/plan_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// " (<reason>)" for a plan's reason; "" for none.
std::string Parenthesized(const std::string& reason) {
  return reason.empty() ? "" : absl::StrCat(" (", reason, ")");
}

}  // namespace

PlanTransport::PlanTransport(std::string worker_id, Device device,
                             TransportFactory make, absl::Duration keep_for)
    : worker_id_(std::move(worker_id)),
      device_(device),
      make_(std::move(make)),
      keep_for_(keep_for),
      watcher_([this] { Watch(); }) {}

PlanTransport::~PlanTransport() {
  {
    absl::MutexLock lock(&abort_mu_);
    stopping_ = true;
  }
  watcher_.join();
  Drop(absl::CancelledError("the worker is shutting down"));
}

void PlanTransport::Watch() {
  abort_mu_.Lock();
  // A round of the published version may still be waiting on a peer that
  // moved on to superseded_by_.
  const auto overtaken = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(abort_mu_) {
    return superseded_by_ > published_version_ &&
           superseded_by_ > replaced_by_ && published_transport_ != nullptr;
  };
  while (!stopping_) {
    if (!overtaken()) {
      const auto wake = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(abort_mu_) {
        return stopping_ || overtaken();
      };
      abort_mu_.Await(absl::Condition(&wake));
      continue;
    }
    const int64_t by = superseded_by_;
    const absl::Time deadline = superseded_at_ + keep_for_;
    const auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(abort_mu_) {
      return stopping_ || !overtaken() || superseded_by_ != by;
    };
    if (abort_mu_.AwaitWithDeadline(absl::Condition(&settled), deadline)) {
      continue;  // moved on, dropped, or a newer plan: look again
    }
    const int64_t version = published_version_;
    const absl::Status why = absl::UnavailableError(absl::StrCat(
        "plan version ", version, " replaced by ", by,
        Parenthesized(superseded_reason_),
        ", which keeps every worker, while a round of version ", version,
        " was still waiting after ", absl::FormatDuration(keep_for_),
        ": a peer that was idle when it came has moved to version ", by));
    ReplaceLocked(by, why);
    abort_mu_.Unlock();
    spdlog::warn("worker={} {}", worker_id_, std::string(why.message()));
    abort_mu_.Lock();
  }
  abort_mu_.Unlock();
}

void PlanTransport::SetSecret(std::string secret) {
  absl::MutexLock lock(&secret_mu_);
  secret_ = std::move(secret);
}

void PlanTransport::Publish(int64_t version,
                            const std::vector<std::string>& workers) {
  absl::MutexLock lock(&abort_mu_);
  // Versions went backwards: the job was created again (a coordinator
  // restarted without its state), and the old job's replacement says
  // nothing about this one.
  if (version < published_version_) {
    replaced_by_ = -1;
    replaced_why_ = absl::OkStatus();
    superseded_by_ = -1;
    superseded_reason_.clear();
  }
  published_version_ = version;
  published_workers_ = workers;
}

bool PlanTransport::AbortFor(const PlanMembership& next) {
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
    // and it finishes on the old transport, unless a peer that was idle has
    // moved on to the new version (Watch aborts it after keep_for_).
    if (lost.empty()) {
      if (next.version > superseded_by_) {
        superseded_by_ = next.version;
        superseded_at_ = absl::Now();
        superseded_reason_ = next.reason;
      }
      return false;
    }
    aborted = ReplaceLocked(
        next.version,
        absl::UnavailableError(absl::StrCat(
            "plan version ", version, " replaced by ", next.version, ": ",
            lost.size() == 1 ? "worker " : "workers ",
            absl::StrJoin(lost, ", "), " left the job",
            Parenthesized(next.reason))));
  }
  spdlog::warn(
      "worker={} plan_version={} replaced by plan_version={}, which drops {}: "
      "{}",
      worker_id_, version, next.version, absl::StrJoin(lost, ", "),
      aborted ? "aborted the transport of any step in progress"
              : "no transport to abort");
  return true;
}

bool PlanTransport::ReplaceLocked(int64_t by, const absl::Status& why) {
  replaced_by_ = by;
  replaced_why_ = why;
  if (published_transport_ == nullptr) return false;
  // Wakes a step waiting on the transport (TCP: its sockets are shut down;
  // NCCL: ncclCommAbort); the step thread destroys it.
  published_transport_->Abort(why);
  return true;
}

absl::Status PlanTransport::Replaced() const {
  absl::MutexLock lock(&abort_mu_);
  if (replaced_by_ <= published_version_) return absl::OkStatus();
  return replaced_why_;
}

bool PlanTransport::AwaitPublished(absl::Duration timeout) const {
  absl::MutexLock lock(&abort_mu_);
  const auto settled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(abort_mu_) {
    return stopping_ || superseded_by_ <= published_version_ ||
           replaced_by_ > published_version_;
  };
  return abort_mu_.AwaitWithTimeout(absl::Condition(&settled), timeout);
}

void PlanTransport::Drop(const absl::Status& reason) {
  if (transport_ == nullptr) return;
  {
    // AbortFor may be aborting it: it is gone only after that.
    absl::MutexLock lock(&abort_mu_);
    published_transport_ = nullptr;
  }
  transport_->Abort(reason);
  transport_.reset();
}

absl::StatusOr<transport::Transport*> PlanTransport::Ensure(
    int rank, const std::vector<std::string>& addresses, int64_t version,
    const absl::Status& blocked, bool* built) {
  *built = false;
  std::string secret;
  {
    absl::MutexLock lock(&secret_mu_);
    secret = secret_;
  }
  if (transport_ != nullptr && secret != built_secret_) {
    Drop(absl::CancelledError(
        absl::StrCat("worker ", Quoted(worker_id_),
                     " got a new data-plane secret; reconnecting")));
  }
  // A newer plan dropped some of this one's workers: no step of it can
  // finish, so none starts (the new version's SetPlan comes).
  if (const absl::Status replaced = Replaced(); !replaced.ok()) {
    Drop(replaced);
    return replaced;
  }
  MUONPS_RETURN_IF_ERROR(blocked);
  if (transport_ != nullptr) return transport_.get();
  // The coordinator hands the secret out when this worker joins: without
  // one it is (re)joining, which a retry outlasts.
  if (secret.empty()) {
    return FieldError(
        absl::StatusCode::kUnavailable, "data_plane_secret",
        absl::StrCat("worker ", Quoted(worker_id_),
                     " has no data-plane secret from the coordinator yet (it "
                     "is joining the job); retry"));
  }
  for (size_t r = 0; r < addresses.size(); ++r) {
    if (addresses[r].empty()) {
      return FieldError(absl::StatusCode::kUnavailable, "plan",
                        absl::StrCat("no data address for rank ", r));
    }
  }
  MUONPS_ASSIGN_OR_RETURN(
      transport_,
      make_(rank, addresses, static_cast<uint64_t>(version), secret));
  built_secret_ = secret;
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
  if (const absl::Status replaced = Replaced(); !replaced.ok()) {
    Drop(replaced);
    return replaced;
  }
  *built = true;
  return transport_.get();
}

}  // namespace worker
}  // namespace muonps
