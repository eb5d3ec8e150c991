// The coordinator service's edge: each muonps.v1.Coordinator request
// becomes the request its part takes (job_catalog.h, membership.h,
// nccl_id_exchange.h, step_stats_recorder.h) and each part's answer the
// reply, here and nowhere else; the records inside them (specs, join
// requests, plans, step stats) go through record_wire.h. A value outside
// an enum is refused there, naming the field; every other check is the
// coordinator's. Pure functions; thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_COORDINATOR_WIRE_H_
#define MUONPS_SERVER_COORDINATOR_COORDINATOR_WIRE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "muonps/v1/coordinator.pb.h"
#include "server/coordinator/job_catalog.h"
#include "server/coordinator/membership.h"
#include "server/coordinator/nccl_id_exchange.h"
#include "server/coordinator/record_wire.h"
#include "server/coordinator/step_stats_recorder.h"

namespace muonps {
namespace coordinator {

// Jobs.
absl::StatusOr<CreateJobRequest> CreateJobRequestFromProto(
    const v1::CreateJobRequest& request);
// Named "jobs/NAME"; the token only when `job` carries one.
v1::Job JobToProto(const JobInfo& job);
v1::ListJobsResponse JobListToProto(const std::vector<JobSummary>& jobs);
DeleteJobRequest DeleteJobRequestFromProto(const v1::DeleteJobRequest& request);

// Membership.
v1::JoinJobResponse JoinGrantToProto(const JoinGrant& grant);
HeartbeatRequest HeartbeatRequestFromProto(const v1::HeartbeatRequest& request);
v1::HeartbeatResponse HeartbeatReplyToProto(const HeartbeatReply& reply);
LeaveRequest LeaveRequestFromProto(const v1::LeaveJobRequest& request);
DrainRequest DrainRequestFromProto(const v1::DrainWorkerRequest& request);
v1::ListWorkersResponse WorkerListToProto(
    const std::vector<WorkerView>& workers);

// NCCL ids.
NcclIdPut NcclIdPutFromProto(const v1::PutNcclIdRequest& request);
NcclIdGet NcclIdGetFromProto(const v1::GetNcclIdRequest& request);
v1::GetNcclIdResponse NcclIdToProto(const NcclId& id);

// Step stats.
StepReport StepReportFromProto(const v1::ReportStepStatsRequest& request);

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_COORDINATOR_WIRE_H_
