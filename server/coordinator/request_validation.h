// Validation of what callers ask the coordinator for, against configurable
// limits, on the coordinator's own types (the edge, coordinator_wire.h, has
// already refused what those types cannot hold, such as a value outside an
// enum). Every failure is an absl::Status whose message names the API's
// field, e.g. `job.matrices[3].rows: 0 is not in [1, 1048576]`. Pure
// functions; thread-safe.
#ifndef MUONPS_SERVER_COORDINATOR_REQUEST_VALIDATION_H_
#define MUONPS_SERVER_COORDINATOR_REQUEST_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/worker_types.h"

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

// The job's name, matrices (names unique, shapes, experts and layers in
// range, totals within the limits: RESOURCE_EXHAUSTED beyond them),
// hyperparameters, bucket bytes, dedicated workers and checkpoint settings.
absl::Status ValidateJobSpec(const JobSpec& spec, const Limits& limits);

// ValidateJobSpec, after the request id's length.
absl::Status ValidateCreateJob(absl::string_view request_id,
                               const JobSpec& spec, const Limits& limits);

// The ids, device, speed, cost table size and data address of a join.
absl::Status ValidateJoinJob(const JoinRequest& request, const Limits& limits);

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_REQUEST_VALIDATION_H_
