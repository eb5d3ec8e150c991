// The coordinator's current plan of a job, as a bench reads it (GetPlan).
#ifndef MUONPS_BENCH_COMMON_COORDINATOR_PLAN_H_
#define MUONPS_BENCH_COMMON_COORDINATOR_PLAN_H_

#include <string>

#include "absl/status/statusor.h"
#include "muonps/v1/plan.pb.h"

namespace muonps {
namespace bench {

// GetPlan of `job` at `coordinator` (HOST:PORT) over a channel with the
// environment's credentials (proto/credentials.h), with a 10 s deadline.
// The channel's error, or the coordinator's naming GetPlan.
absl::StatusOr<v1::Plan> FetchPlan(const std::string& coordinator,
                                   const std::string& job);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_COMMON_COORDINATOR_PLAN_H_
