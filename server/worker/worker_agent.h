// A worker's membership in a job: joins through the coordinator, keeps its
// lease alive with heartbeats (re-joining if the lease was lost), and
// follows WatchPlan so it always knows the current plan version. Each plan
// goes to the engine from a thread of its own, retried until the engine
// takes it (the coordinator's calls it needs may fail, the engine may
// refuse it) or a newer one arrives; meanwhile Status says "behind" and
// CheckPlanCurrent refuses steps, naming why.
//
// A coordinator that is down (UNAVAILABLE, DEADLINE_EXCEEDED) changes
// nothing: heartbeats and the watch retry with backoff while steps go on,
// and a coordinator restarted on its --state_dir takes them back as they
// were. A coordinator that no longer knows the membership (NOT_FOUND for
// the job or worker, a rejected token, or a plan version above its latest:
// FAILED_PRECONDITION, or INVALID_ARGUMENT from older coordinators) means
// the lease is lost: the agent joins again with backoff and takes the
// coordinator's current plan, whatever its version, and until it has it
// CheckPlanCurrent refuses steps, so no step runs on a plan the
// coordinator no longer has. The heartbeat thread never waits on a step.
//
// Start() spawns the membership and watch threads (the delivery's waits
// from construction for the watch's first plan); Stop() leaves the job and
// joins them all. Accessors are thread-safe.
#ifndef MUONPS_SERVER_WORKER_WORKER_AGENT_H_
#define MUONPS_SERVER_WORKER_WORKER_AGENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics.h"
#include "muonps/v1/coordinator.grpc.pb.h"
#include "muonps/v1/worker.pb.h"
#include "server/worker/join_credentials.h"
#include "server/worker/plan_delivery.h"
#include "server/worker/step_engine.h"

namespace muonps {
namespace worker {

struct AgentOptions {
  std::string coordinator;  // host:port, for logs
  // The channel to it, with the process's credentials (proto/credentials.h).
  std::shared_ptr<grpc::Channel> coordinator_channel;
  // Receives the worker token and data-plane secret of every join.
  std::shared_ptr<JoinCredentials> credentials;
  std::string job;
  std::string worker_id;
  v1::Device device;
  std::string cost_table;  // text format, may be empty
  double speed = 1.0;
  std::string data_address;
  // No trainer attaches here (a GPU of a dedicated optimizer pool): the
  // agent runs the engine's FollowStep in a thread of its own.
  bool dedicated = false;
  // Called (once, on the heartbeat thread) when the coordinator says this
  // worker drains though it never asked (an operator's `muonps drain`):
  // the process should then Drain() and Stop() as on SIGTERM.
  std::function<void()> on_drain_requested;
};

class WorkerAgent {
 public:
  // `metrics` and `engine` (may be null: control plane only) must outlive
  // the agent. Every new plan goes to the engine with the job's spec and
  // the workers' data addresses, after StepEngine::AbortForPlan (a step
  // waiting on a worker the plan dropped fails at once).
  WorkerAgent(AgentOptions options, MetricsRegistry* metrics,
              StepEngine* engine = nullptr);
  ~WorkerAgent();
  WorkerAgent(const WorkerAgent&) = delete;
  WorkerAgent& operator=(const WorkerAgent&) = delete;

  void Start();
  // Leaves the job (best effort) and stops the threads. Idempotent.
  void Stop();

  // Hands this worker's momentum over before it leaves, then stops its
  // steps; call Stop() after it. It asks the coordinator to drain the
  // worker (LeaveJob with drain: a plan version in which it is a rank that
  // owns nothing), waits until a step commits here under that version
  // (every rank then ran its handover, so the new owners hold the
  // momentum), and StopStepping. OK when the momentum moved, or when there
  // was none (no step ever committed here). Otherwise why not, after
  // `timeout` or once `cut_short` (may be null) is notified: the
  // coordinator unreachable (DEADLINE_EXCEEDED), no other worker to own the
  // matrices (FAILED_PRECONDITION), no step under the drained plan
  // (DEADLINE_EXCEEDED); the momentum it holds then goes to the job's
  // checkpoint of its last step, where the job keeps checkpoints, as it
  // does when the worker leaves without a drain while its trainer goes on
  // (--drain_timeout 0, or a drain refused: the job's last worker). Logs
  // its progress.
  absl::Status Drain(absl::Duration timeout,
                     const absl::Notification* cut_short);

  // The worker's view for the local control service: state "behind" (and
  // plan_error) while the engine could not take the newest plan received.
  v1::WorkerStatus Status() const;
  // The plan the engine follows, if any.
  std::optional<v1::Plan> plan() const;
  const std::string& instance_id() const { return instance_id_; }

  // Queues a finished step's statistics for the coordinator (sent after
  // the next heartbeat, off the step's path; ListWorkers shows the newest
  // as the worker's last_step), counts the momentum resets
  // the engine made before it (muonps_worker_momentum_resets_total), and
  // sets the last step's gauges: muonps_worker_step_seconds,
  // muonps_worker_step_compute_seconds and its plan's prediction,
  // muonps_worker_step_compute_predicted_seconds (their ratio is the cost
  // model's error on this worker).
  void ReportStep(const StepResponse& step);

  // OK unless the lease was lost and the coordinator's current plan has not
  // arrived since, or the engine could not take the newest plan received:
  // then UNAVAILABLE naming the worker, the job (or the plan version) and
  // why (a step would run on a plan the coordinator no longer has; the
  // trainer retries it once the agent has joined again, or the plan is
  // taken). Never waits.
  absl::Status CheckPlanCurrent() const;

 private:
  void MembershipLoop();
  void WatchLoop();
  // Dedicated workers: steps whenever the trainers' workers open one.
  void FollowLoop();
  // Joins, retrying with backoff until it succeeds or Stop(); returns false
  // on Stop().
  bool JoinWithRetry();
  // The coordinator no longer knows this membership (`why`): refuse steps
  // until the plan of the next join arrives, and restart the watch.
  void LoseLease(const std::string& why);
  // Hands `plan` to the engine (fetching the job spec and addresses): the
  // coordinator's error (a call that failed) or the engine's (SetPlan).
  // PlanDelivery's thread calls it, and TakePlan once it succeeded (the
  // watch opened in join `epoch` brought the plan).
  absl::Status DeliverPlan(const v1::Plan& plan);
  void TakePlan(const v1::Plan& plan, int64_t epoch);
  void FlushStepStats();

  const AgentOptions options_;
  const std::string instance_id_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  absl::Notification stop_;
  std::thread membership_thread_;
  std::thread watch_thread_;
  std::thread follow_thread_;

  mutable absl::Mutex mu_;
  std::string state_ ABSL_GUARDED_BY(mu_) = "joining";
  // The plan the engine follows (the last one it took).
  std::optional<v1::Plan> plan_ ABSL_GUARDED_BY(mu_);
  // The newest version the watch received (0: none), which a reopened
  // watch names as known.
  int64_t received_version_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  std::optional<v1::JobSpec> job_spec_ ABSL_GUARDED_BY(mu_);
  std::vector<StepResponse> pending_stats_ ABSL_GUARDED_BY(mu_);
  // The engine's momentum_resets_total() the metric has counted.
  int64_t resets_counted_ ABSL_GUARDED_BY(mu_) = 0;
  // Successful joins so far; a watch stream remembers the one it opened in.
  int64_t join_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // While >= 0 the lease was lost at that epoch and the plan is stale: only
  // a plan from a watch opened after a later join is current again.
  int64_t lost_at_epoch_ ABSL_GUARDED_BY(mu_) = -1;
  std::string lost_reason_ ABSL_GUARDED_BY(mu_);
  // The data-plane secret last given to the engine (membership thread only).
  std::string engine_secret_;
  // The coordinator's last word on whether this worker drains (heartbeat
  // thread only), and whether it was asked here (Drain).
  bool told_draining_ = false;
  std::atomic<bool> draining_{false};

  Gauge* plan_version_;
  Counter* heartbeats_;
  Counter* joins_;
  Counter* momentum_resets_;
  Gauge* step_seconds_;
  Gauge* step_compute_seconds_;
  Gauge* step_compute_predicted_seconds_;
  StepEngine* engine_;
  // Last: its thread calls DeliverPlan and TakePlan, which use the rest.
  PlanDelivery delivery_;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_WORKER_AGENT_H_
