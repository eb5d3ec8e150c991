// Validation of coordinator requests against configurable limits. Every
// failure is an absl::Status whose message names the field, e.g.
// `job.matrices[3].rows: 0 is not in [1, 1048576]`. Pure functions.
#ifndef MUONPS_SERVER_COORDINATOR_REQUEST_VALIDATION_H_
#define MUONPS_SERVER_COORDINATOR_REQUEST_VALIDATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "muonps/v1/coordinator.pb.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace coordinator {

// Limits on what one request may ask for; flags set them in main().
struct Limits {
  int64_t max_jobs = 1000;
  // Matrices per job, each expert of a stack counted (the planner's items).
  int64_t max_matrices_per_job = 1000000;
  // Parameters (rows * cols * experts summed) per job.
  int64_t max_parameters_per_job = int64_t{1} << 44;
  int64_t max_dim = int64_t{1} << 20;
  int64_t max_experts = 65536;
  int64_t max_name_bytes = 256;
  int64_t max_workers_per_job = 4096;
  int64_t max_cost_table_bytes = int64_t{4} << 20;
  int64_t max_message_bytes = int64_t{256} << 20;
  int64_t max_request_id_bytes = 64;
};

// Job names and worker ids: 1..128 bytes of [A-Za-z0-9._-].
absl::Status ValidateId(absl::string_view value, absl::string_view field);

// Checks a JobSpec and converts its matrices for the planner (defaults
// filled in: experts 1, fp32, replicated).
absl::StatusOr<std::vector<scheduler::MatrixSpec>> ValidateJobSpec(
    const v1::JobSpec& spec, const Limits& limits);

absl::Status ValidateCreateJob(const v1::CreateJobRequest& request,
                               const Limits& limits);
absl::Status ValidateJoinJob(const v1::JoinJobRequest& request,
                             const Limits& limits);

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_REQUEST_VALIDATION_H_
