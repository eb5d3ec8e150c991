// What the coordinator is configured with (from flags, in main) and the
// clock it reads. Plain values.
#ifndef MUONPS_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_
#define MUONPS_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_

#include <functional>

#include "absl/time/time.h"
#include "scheduler/step_clock.h"
#include "server/coordinator/request_validation.h"

namespace muonps {
namespace coordinator {

struct CoordinatorOptions {
  Limits limits;
  absl::Duration lease_ttl = absl::Seconds(6);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Plan versions kept per job for GetPlan.
  int plan_history = 16;
  // The links plans weigh between the workers of a node and across nodes
  // (--nvlink_gbs, --network_gbs; the rest as scheduler::LinkFigures).
  scheduler::LinkFigures links;
  // How far above the mean the busiest rank's measured Newton-Schulz may
  // run before the job re-plans with its ranks' measured speeds
  // (--rebalance_tolerance; RebalanceByMeasurement). 0: never.
  double rebalance_tolerance = 0.05;
};

// The coordinator's time (leases, create and join times); tests pass a
// fake one. Must be thread-safe.
using Clock = std::function<absl::Time()>;

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_COORDINATOR_OPTIONS_H_
