// Human-readable renderings of coordinator answers for the muonps CLI.
// Pure functions.
#ifndef MUONPS_TOOLS_MUONPS_PLAN_TABLE_H_
#define MUONPS_TOOLS_MUONPS_PLAN_TABLE_H_

#include <optional>
#include <string>

#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/plan.pb.h"

namespace muonps {
namespace cli {

// Summary (with the owner groups, when the plan has them), per-worker
// loads, and one line per matrix (owner(s), bucket).
std::string PlanTable(const v1::Plan& plan);
std::string JobsTable(const v1::ListJobsResponse& jobs);
// One line per worker: device, lease, plan version, and its last reported
// step (step id, compute ms measured and predicted by the plan, and
// CostModelError as a signed percentage); "-" where a worker has reported no
// step, or its plan predicted nothing (the error).
std::string WorkersTable(const v1::ListWorkersResponse& workers);

// The plan's cost-model error on a worker's step: ns_seconds /
// predicted_ns_seconds - 1 (+0.08: the step ran 8% slower than planned);
// nullopt when the plan predicted no compute for it.
std::optional<double> CostModelError(const v1::WorkerStepStats& step);

// The message as JSON with the .proto field names.
std::string ToJson(const google::protobuf::Message& message);

}  // namespace cli
}  // namespace muonps

#endif  // MUONPS_TOOLS_MUONPS_PLAN_TABLE_H_
