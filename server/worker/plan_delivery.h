// PlanDelivery: hands the plans a worker's watch receives to its engine,
// from a thread of its own, so the watch keeps reading while a plan is
// installed. The newest plan goes first (an older one still waiting is
// skipped); a plan that cannot be taken (a call to the coordinator it
// needs failed, or the engine refused it) is tried again with backoff
// until it is taken or a newer one arrives, and meanwhile Refused() says
// why, so that steps can be refused naming it instead of running on the
// version it replaces. Before, a plan whose delivery failed once was never
// tried again, while the worker reported it as its version.
//
// Thread-safe. Not copyable.
#ifndef MUONPS_SERVER_WORKER_PLAN_DELIVERY_H_
#define MUONPS_SERVER_WORKER_PLAN_DELIVERY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "muonps/v1/coordinator.pb.h"

namespace muonps {
namespace worker {

class PlanDelivery {
 public:
  // Installs a plan in the engine: OK once it follows it.
  using Deliver = std::function<absl::Status(const v1::Plan& plan)>;
  // Told of each plan once Deliver took it, with the `epoch` it arrived
  // with, on the delivery thread and holding no lock of this class.
  using Taken = std::function<void(const v1::Plan& plan, int64_t epoch)>;

  // `who` names the worker in logs ("job=j worker=w").
  PlanDelivery(std::string who, Deliver deliver, Taken taken);
  // Stop()s.
  ~PlanDelivery();
  PlanDelivery(const PlanDelivery&) = delete;
  PlanDelivery& operator=(const PlanDelivery&) = delete;

  // Stops the thread, after a Deliver in progress; no plan is delivered
  // after it returns. Idempotent.
  void Stop();

  // A plan the watch received (the watch opened in join `epoch`): it
  // replaces any plan still waiting, and cuts a retry's wait short.
  void Arrived(v1::Plan plan, int64_t epoch);

  // The newest plan received that the engine has not taken: its version
  // and why the last try failed. nullopt while none is waiting, or while
  // the one waiting has not failed yet (its first try is on its way).
  struct Refusal {
    int64_t version = 0;
    absl::Status why;
  };
  std::optional<Refusal> Refused() const;

 private:
  void Loop();

  const std::string who_;
  const Deliver deliver_;
  const Taken taken_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The newest plan received and not taken yet, the epoch it came with,
  // and a count of arrivals (so a try sees that a newer one came).
  std::optional<v1::Plan> waiting_ ABSL_GUARDED_BY(mu_);
  int64_t waiting_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t arrivals_ ABSL_GUARDED_BY(mu_) = 0;
  // Why waiting_ was not taken on its last try (OK: not tried yet).
  absl::Status refused_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // runs Loop(); last member: starts after the rest
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_PLAN_DELIVERY_H_
