// Human-readable renderings of coordinator answers for the muonps CLI.
// Pure functions.
#ifndef MUONPS_TOOLS_MUONPS_PLAN_TABLE_H_
#define MUONPS_TOOLS_MUONPS_PLAN_TABLE_H_

#include <string>

#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/plan.pb.h"

namespace muonps {
namespace cli {

// Summary, per-worker loads, and one line per matrix (owner(s), bucket).
std::string PlanTable(const v1::Plan& plan);
std::string JobsTable(const v1::ListJobsResponse& jobs);
std::string WorkersTable(const v1::ListWorkersResponse& workers);

// The message as JSON with the .proto field names.
std::string ToJson(const google::protobuf::Message& message);

}  // namespace cli
}  // namespace muonps

#endif  // MUONPS_TOOLS_MUONPS_PLAN_TABLE_H_
