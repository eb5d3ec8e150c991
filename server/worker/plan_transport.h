// PlanTransport: the transport a worker's steps run on for the plan
// version it follows, and the way out when a newer plan drops some of that
// version's workers. It builds the transport from the factory (rank, the
// peers' data addresses, session = the plan version, the job's data-plane
// secret as last set), builds it again for a new secret, drops it when a
// step fails on it or a new version replaces it, and lets AbortFor (the
// agent's watch thread, as soon as a new plan arrives) abort it without
// the step's lock, so that a step waiting on a worker the new plan dropped
// fails at once instead of at the transport's timeout; no step of the old
// version starts after that. A newer plan that keeps every worker lets a
// round in progress finish on the old transport, for `keep_for`: a peer
// that was idle when that plan came has already moved to the new version
// and will never join the round, so past it the transport is aborted (a
// thread of the PlanTransport's own waits for that).
//
// Thread-safe, in two parts. The transport itself (Ensure, Drop, get) is
// the step thread's: the caller serializes those calls with its steps
// (StepEngine's lock). SetSecret, AbortFor and Replaced may come from any
// thread; they take small locks held across nothing slower than
// Transport::Abort, which records the reason and wakes the waiting call.
// Not copyable.
#ifndef MUONPS_SERVER_WORKER_PLAN_TRANSPORT_H_
#define MUONPS_SERVER_WORKER_PLAN_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/device.h"
#include "server/worker/job_plan.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// Builds the transport for a plan version: (rank, peer addresses by rank,
// session = the plan version, the job's data-plane secret as last given to
// SetSecret, empty if never) -> a connected transport. The TCP transport
// proves membership with the secret and refuses an empty or short one
// (TcpOptions::data_plane_secret); the NCCL one ignores it.
using TransportFactory =
    std::function<absl::StatusOr<std::unique_ptr<transport::Transport>>(
        int rank, const std::vector<std::string>& addresses, uint64_t session,
        const std::string& data_plane_secret)>;

class PlanTransport {
 public:
  // For worker `worker_id` (named in errors and logs) on `device`, whose
  // memory every transport must use.
  PlanTransport(std::string worker_id, Device device, TransportFactory make,
                absl::Duration keep_for = kKeepForDefault);
  // How long a round of a version may go on after a newer version that
  // keeps every worker arrived: rounds take milliseconds to a second.
  static constexpr absl::Duration kKeepForDefault = absl::Seconds(3);
  PlanTransport(const PlanTransport&) = delete;
  PlanTransport& operator=(const PlanTransport&) = delete;
  // Aborts the transport, if any.
  ~PlanTransport();

  // The job's data-plane secret for every transport built from now on; a
  // transport built with another one is rebuilt by the next Ensure. Kept
  // in memory, never logged. Never waits for a step.
  void SetSecret(std::string secret);

  // The plan version steps now follow (by the step thread, once it is
  // set): its version and workers, for AbortFor. Versions going backwards
  // (the job was created again) forget an older replacement.
  void Publish(int64_t version, const std::vector<std::string>& workers);

  // Call with every plan as soon as it arrives. When `next` is newer than
  // the published version and leaves out some of its workers, the
  // transport is aborted at once and Replaced() answers UNAVAILABLE saying
  // `plan version N replaced by M: worker "w1" left the job (<reason>)`
  // until a version at least as new is published. Returns whether `next`
  // replaced the published version that way. When `next` keeps every
  // worker, the same happens `keep_for` later unless a version at least as
  // new was published meanwhile (the step thread moved on) or the transport
  // was dropped. Never waits for a step.
  bool AbortFor(const PlanMembership& next);
  // Why the published version can no longer step; OK if it can.
  absl::Status Replaced() const;
  // Waits, at most `timeout`, while a plan newer than the published version
  // that keeps every worker has arrived (AbortFor saw it) and is not
  // published yet: a step about to start runs on that plan once it is
  // installed, rather than on the version it replaces, whose peers may
  // have moved on (and whose transport the install drops). Returns at once
  // when none is pending, or when a newer plan dropped workers (Replaced()
  // refuses the step then, naming them); true unless the timeout passed.
  // Never call it holding a lock the install takes.
  bool AwaitPublished(absl::Duration timeout) const;

  // The transport of version `version` (this worker is `rank` among
  // `addresses`), built if there is none: OK with *built set when it is
  // new (the caller runs what a new transport needs first, the momentum
  // handover). A transport of an older secret is dropped first. Errors:
  // Replaced()'s (the transport dropped); then `blocked` when it is not OK
  // (an error every step of the version answers); UNAVAILABLE naming
  // `data_plane_secret` while no secret was set (the worker is joining),
  // or `plan` for a rank with no data address; the factory's; INTERNAL for
  // a transport of the other kind of memory.
  absl::StatusOr<transport::Transport*> Ensure(
      int rank, const std::vector<std::string>& addresses, int64_t version,
      const absl::Status& blocked, bool* built);
  // Aborts and destroys the transport (if any) with `reason`.
  void Drop(const absl::Status& reason);
  // The transport (null: none). The step thread's.
  transport::Transport* get() const { return transport_.get(); }

 private:
  const std::string worker_id_;
  const Device device_;
  const TransportFactory make_;
  // The step thread's (see the class comment).
  std::unique_ptr<transport::Transport> transport_;
  std::string built_secret_;  // the secret transport_ was built with
  mutable absl::Mutex secret_mu_;
  std::string secret_ ABSL_GUARDED_BY(secret_mu_);
  // What AbortFor reads: the published version and workers, and transport_
  // (published once built, cleared before it is destroyed).
  mutable absl::Mutex abort_mu_;
  int64_t published_version_ ABSL_GUARDED_BY(abort_mu_) = -1;
  std::vector<std::string> published_workers_ ABSL_GUARDED_BY(abort_mu_);
  transport::Transport* published_transport_ ABSL_GUARDED_BY(abort_mu_) =
      nullptr;
  // The newest version that dropped workers of published_version_ (-1:
  // none), and the status steps of the older version fail with.
  int64_t replaced_by_ ABSL_GUARDED_BY(abort_mu_) = -1;
  absl::Status replaced_why_ ABSL_GUARDED_BY(abort_mu_);
  // The newest version that kept every worker of published_version_ (-1:
  // none), when it arrived and why it was made.
  int64_t superseded_by_ ABSL_GUARDED_BY(abort_mu_) = -1;
  absl::Time superseded_at_ ABSL_GUARDED_BY(abort_mu_);
  std::string superseded_reason_ ABSL_GUARDED_BY(abort_mu_);
  bool stopping_ ABSL_GUARDED_BY(abort_mu_) = false;

  // Steps of the published version fail with `why` from now on (until
  // version `by` is published), and its transport, if any, is aborted:
  // whether there was one.
  bool ReplaceLocked(int64_t by, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(abort_mu_);
  // Aborts a transport still published keep_for_ after a newer version
  // that kept every worker arrived.
  void Watch();
  const absl::Duration keep_for_;
  std::thread watcher_;  // runs Watch(); last member: starts after the rest
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_PLAN_TRANSPORT_H_
