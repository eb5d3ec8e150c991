// libFuzzer target: what a worker does with a plan it is sent
// (server/worker/step_engine.cc's SetPlan, without the memory): the
// job's translation to C++ types (proto/translate.h), the plan's ownership
// and batches, and the step schedule built from them, with the batches'
// parts cut into each stack's chunks (scheduler/step_schedule.h). The
// input's first record is the JobSpec (kept only if the coordinator's own
// checks accept it, as a worker only ever sees such a job), every further
// record a Plan for it.
// Any status is fine; a crash, a sanitizer report or a hang is a finding.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz/fuzz_input.h"
#include "muonps/v1/coordinator.pb.h"
#include "muonps/v1/plan.pb.h"
#include "proto/translate.h"
#include "scheduler/step_schedule.h"
#include "server/coordinator/record_wire.h"
#include "server/coordinator/request_validation.h"

namespace muonps {
namespace fuzz {
namespace {

// Limits that keep one input fast; the checks are the production ones.
coordinator::Limits FuzzLimits() {
  coordinator::Limits limits;
  limits.max_matrices_per_job = 512;
  limits.max_experts = 64;
  return limits;
}

void DecodePlan(const v1::JobSpec& job,
                const std::vector<scheduler::MatrixSpec>& matrices,
                const v1::Plan& plan) {
  absl::StatusOr<scheduler::OwnershipPlan> ownership =
      proto::OwnershipFromPlan(plan, matrices);
  if (!ownership.ok()) return;
  scheduler::ScheduleOptions options;
  if (job.bucket_bytes() > 0) options.bucket_bytes = job.bucket_bytes();
  absl::StatusOr<scheduler::StepSchedule> schedule =
      scheduler::BuildStepSchedule(matrices, *ownership, options);
  if (!schedule.ok()) return;
  (void)scheduler::IssueOrder(*schedule);
}

}  // namespace
}  // namespace fuzz
}  // namespace muonps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muonps;
  fuzz::FuzzInput input(data, size);
  fuzz::FuzzRecord record;
  if (!input.Next(&record)) return 0;
  v1::JobSpec job;
  if (!job.ParseFromString(record.payload)) return 0;
  const absl::StatusOr<coordinator::JobSpec> spec =
      coordinator::JobSpecFromProto(job);
  if (!spec.ok() ||
      !coordinator::ValidateJobSpec(*spec, fuzz::FuzzLimits()).ok()) {
    return 0;
  }
  const std::vector<scheduler::MatrixSpec> matrices =
      proto::MatricesFromJob(job);
  (void)proto::MuonFromProto(job.muon());
  while (input.Next(&record)) {
    v1::Plan plan;
    if (!plan.ParseFromString(record.payload)) continue;
    fuzz::DecodePlan(job, matrices, plan);
  }
  return 0;
}
