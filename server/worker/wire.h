// The worker's edge: muonps.v1 messages become the domain structs its core
// reads (attach_request.h, step_request.h, job_plan.h) and its answers
// become messages again, here and nowhere else. WorkerService converts
// the trainer's calls, WorkerAgent the coordinator's plans. What a message
// can hold that no domain value can (an enum value this build does not
// know, a group index out of range) is refused here, naming the field;
// everything else is checked by the core. Pure functions; thread-safe.
#ifndef MUONPS_SERVER_WORKER_WIRE_H_
#define MUONPS_SERVER_WORKER_WIRE_H_

#include "absl/status/statusor.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/plan.pb.h"
#include "muonps/v1/worker.pb.h"
#include "server/worker/attach_request.h"
#include "server/worker/job_plan.h"
#include "server/worker/step_request.h"

namespace muonps {
namespace worker {

// INVALID_ARGUMENT naming `tensor "name".dtype`, `.layout` or `.group` for
// a value outside its enum or range (group 0..kMaxParamGroups).
absl::StatusOr<AttachRequest> AttachRequestFromProto(
    const v1::AttachRequest& request);
v1::AttachResponse AttachResponseToProto(const AttachResponse& response);

StepRequest StepRequestFromProto(const v1::StepRequest& request);
v1::StepResponse StepResponseToProto(const StepResponse& response);

// The job's settings (defaults filled in) and the plan's owners and
// batches; INVALID_ARGUMENT naming the plan field when the plan names a
// matrix, expert or worker the job does not have.
absl::StatusOr<JobPlan> JobPlanFromProto(const v1::JobSpec& job,
                                         const v1::Plan& plan);
PlanMembership MembershipFromProto(const v1::Plan& plan);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_WIRE_H_
