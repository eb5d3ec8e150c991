// Conversion of a scheduler plan and step schedule into the muonps.v1.Plan
// message that workers follow and operators read. Pure functions.
#ifndef MUONPS_SERVER_COORDINATOR_PLAN_PROTO_H_
#define MUONPS_SERVER_COORDINATOR_PLAN_PROTO_H_

#include <string>
#include <vector>

#include "muonps/v1/plan.pb.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace coordinator {

struct PlanContext {
  std::string job;
  int64_t version = 0;
  std::string reason;
  double plan_ms = 0;
};

v1::Plan PlanToProto(const PlanContext& context,
                     const std::vector<scheduler::MatrixSpec>& matrices,
                     const scheduler::OwnershipPlan& plan,
                     const scheduler::StepSchedule& schedule);

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_PLAN_PROTO_H_
