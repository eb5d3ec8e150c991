// The coordinator's records on the wire: a job's spec, a worker's join
// request and device, a published plan and a worker's step stats, as
// muonps.v1 messages and back, here and nowhere else. CoordinatorService
// answers with them (through coordinator_wire.h) and the JobStore keeps
// them on disk as these messages, serialized. Shared vocabulary (dtypes,
// layouts, matrices, plan batches) goes through proto/translate.h.
//
// What a message can hold that no domain value can (a value outside an
// enum) is refused here, INVALID_ARGUMENT naming the API's field; every
// other check is the coordinator's (request_validation.h). A spec or a
// plan is answered back as it came: JobSpecToProto(JobSpecFromProto(m))
// and PlanToProto(PlanFromProto(m)) serialize as m does (an empty muon or
// adamw message reads as none). Pure functions; thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_RECORD_WIRE_H_
#define MUONPS_SERVER_COORDINATOR_RECORD_WIRE_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/plan.pb.h"
#include "muonps/v1/types.pb.h"
#include "scheduler/plan_types.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/published_plan.h"
#include "server/coordinator/worker_types.h"

namespace muonps {
namespace coordinator {

// INVALID_ARGUMENT naming job.matrices[i].dtype or .layout,
// job.muon.adjust_lr_fn or job.muon.ns_algorithm for a value outside its
// enum. The matrices through proto::MatrixFromProto (the one conversion).
absl::StatusOr<JobSpec> JobSpecFromProto(const v1::JobSpec& spec);
v1::JobSpec JobSpecToProto(const JobSpec& spec);

WorkerDevice DeviceFromProto(const v1::Device& device);
v1::Device DeviceToProto(const WorkerDevice& device);
JoinRequest JoinRequestFromProto(const v1::JoinJobRequest& request);
v1::JoinJobRequest JoinRequestToProto(const JoinRequest& request);

// Named "jobs/JOB/plans/VERSION"; placements, batches and loads in the
// order of the job's matrices and the plan's ranks, and the owner groups
// (OwnershipPlan::groups) by worker id.
v1::Plan PlanToProto(const PublishedPlan& plan);
// `plan` for a job of `matrices` (shared into the result). INVALID_ARGUMENT
// naming the plan field that names a matrix, expert or worker the job or
// plan does not have (proto::OwnershipFromPlan, loads, buckets).
absl::StatusOr<std::shared_ptr<const PublishedPlan>> PlanFromProto(
    const v1::Plan& plan,
    std::shared_ptr<const std::vector<scheduler::MatrixSpec>> matrices);

v1::WorkerStepStats StepStatsToProto(const StepStats& stats);

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_RECORD_WIRE_H_
