#include "server/coordinator/coordinator_wire.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/coordinator/record_wire.h"

namespace muonps {
namespace coordinator {
namespace {

int64_t ToMs(absl::Duration d) { return absl::ToInt64Milliseconds(d); }

}  // namespace

absl::StatusOr<CreateJobRequest> CreateJobRequestFromProto(
    const v1::CreateJobRequest& request) {
  CreateJobRequest out;
  out.request_id = request.request_id();
  MUONPS_ASSIGN_OR_RETURN(out.job, JobSpecFromProto(request.job()));
  return out;
}

v1::Job JobToProto(const JobInfo& job) {
  v1::Job out;
  out.set_name(absl::StrCat("jobs/", job.name));
  if (job.spec != nullptr) *out.mutable_spec() = JobSpecToProto(*job.spec);
  for (const std::string& id : job.workers) out.add_workers(id);
  out.set_plan_version(job.plan_version);
  out.set_create_time_ms(absl::ToUnixMillis(job.create_time));
  out.set_job_token(job.job_token);
  return out;
}

v1::ListJobsResponse JobListToProto(const std::vector<JobSummary>& jobs) {
  v1::ListJobsResponse out;
  for (const JobSummary& job : jobs) {
    v1::JobSummary* s = out.add_jobs();
    s->set_name(job.name);
    s->set_matrices(job.matrices);
    s->set_parameters(job.parameters);
    s->set_workers(job.workers);
    s->set_plan_version(job.plan_version);
  }
  return out;
}

DeleteJobRequest DeleteJobRequestFromProto(
    const v1::DeleteJobRequest& request) {
  return {request.job(), request.job_token()};
}

v1::JoinJobResponse JoinGrantToProto(const JoinGrant& grant) {
  v1::JoinJobResponse out;
  out.set_lease_ttl_ms(ToMs(grant.lease_ttl));
  out.set_heartbeat_interval_ms(ToMs(grant.heartbeat_interval));
  out.set_plan_version(grant.plan_version);
  out.set_worker_token(grant.worker_token);
  out.set_data_plane_secret(grant.data_plane_secret);
  return out;
}

HeartbeatRequest HeartbeatRequestFromProto(const v1::HeartbeatRequest& r) {
  HeartbeatRequest out{r.job(), r.worker_id(), r.instance_id(),
                       r.plan_version(), r.worker_token()};
  out.has_trainer = r.has_trainer();
  if (r.has_trainer_rank()) out.trainer_rank = r.trainer_rank();
  return out;
}

v1::HeartbeatResponse HeartbeatReplyToProto(const HeartbeatReply& reply) {
  v1::HeartbeatResponse out;
  out.set_lease_ttl_ms(ToMs(reply.lease_ttl));
  out.set_plan_version(reply.plan_version);
  out.set_draining(reply.draining);
  return out;
}

LeaveRequest LeaveRequestFromProto(const v1::LeaveJobRequest& r) {
  return {r.job(), r.worker_id(), r.instance_id(), r.worker_token(), r.drain()};
}

DrainRequest DrainRequestFromProto(const v1::DrainWorkerRequest& r) {
  return {r.job(), r.worker_id()};
}

v1::ListWorkersResponse WorkerListToProto(
    const std::vector<WorkerView>& workers) {
  v1::ListWorkersResponse out;
  for (const WorkerView& w : workers) {
    v1::WorkerInfo* info = out.add_workers();
    info->set_job(w.job);
    info->set_worker_id(w.worker_id);
    *info->mutable_device() = DeviceToProto(w.device);
    info->set_data_address(w.data_address);
    info->set_lease_remaining_ms(ToMs(w.lease_remaining));
    info->set_plan_version(w.plan_version);
    info->set_join_time_ms(absl::ToUnixMillis(w.join_time));
    if (w.last_step.has_value()) {
      *info->mutable_last_step() = StepStatsToProto(*w.last_step);
    }
    info->set_draining(w.draining);
    info->set_speed_factor(w.speed_factor);
    info->set_standby(w.standby);
  }
  return out;
}

NcclIdPut NcclIdPutFromProto(const v1::PutNcclIdRequest& r) {
  NcclIdPut out;
  out.job = r.job();
  out.plan_version = r.plan_version();
  out.worker_id = r.worker_id();
  out.worker_token = r.worker_token();
  out.nccl_id = r.nccl_id();
  out.generation = r.generation();
  return out;
}

NcclIdGet NcclIdGetFromProto(const v1::GetNcclIdRequest& r) {
  NcclIdGet out;
  out.job = r.job();
  out.plan_version = r.plan_version();
  out.min_generation = r.min_generation();
  out.worker_id = r.worker_id();
  out.worker_token = r.worker_token();
  return out;
}

v1::GetNcclIdResponse NcclIdToProto(const NcclId& id) {
  v1::GetNcclIdResponse out;
  out.set_nccl_id(id.id);
  out.set_generation(id.generation);
  out.set_age_ms(absl::ToInt64Milliseconds(id.age));
  return out;
}

StepReport StepReportFromProto(const v1::ReportStepStatsRequest& r) {
  StepReport out;
  out.job = r.job();
  out.worker_id = r.worker_id();
  out.worker_token = r.worker_token();
  out.stats.step = r.step();
  out.stats.plan_version = r.plan_version();
  out.stats.step_seconds = r.step_seconds();
  out.stats.ns_seconds = r.ns_seconds();
  out.stats.predicted_ns_seconds = r.predicted_ns_seconds();
  out.stats.bytes_moved = r.bytes_moved();
  return out;
}

}  // namespace coordinator
}  // namespace muonps
