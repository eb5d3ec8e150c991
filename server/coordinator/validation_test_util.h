// What the request validation tests share (request_validation.h): the
// IsFieldError matcher, SmallLimits (limits small enough to reach), NaN and
// infinity, and the checks of muonps.v1 requests as the coordinator makes
// them (converted at the edge, record_wire.h, then validated). Tests only
// (testonly in BUILD).
#ifndef MUONPS_SERVER_COORDINATOR_VALIDATION_TEST_UTIL_H_
#define MUONPS_SERVER_COORDINATOR_VALIDATION_TEST_UTIL_H_

#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "muonps/v1/coordinator.pb.h"
#include "server/coordinator/record_wire.h"
#include "server/coordinator/request_validation.h"

namespace muonps {
namespace coordinator {
namespace validation_test {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// The status has `code` and its message is "<field>: ...".
MATCHER_P2(IsFieldError, code, field, "") {
  *result_listener << "status is " << arg;
  return arg.code() == code &&
         std::string(arg.message()).rfind(std::string(field) + ": ", 0) == 0;
}

inline Limits SmallLimits() {
  Limits limits;
  limits.max_dim = 4096;
  limits.max_experts = 64;
  limits.max_name_bytes = 32;
  limits.max_cost_table_bytes = 16;
  return limits;
}

// `spec` converted and validated: its matrices, or the first error.
inline absl::StatusOr<std::vector<scheduler::MatrixSpec>> CheckSpec(
    const v1::JobSpec& spec, const Limits& limits) {
  absl::StatusOr<JobSpec> converted = JobSpecFromProto(spec);
  if (!converted.ok()) return converted.status();
  const absl::Status valid = ValidateJobSpec(*converted, limits);
  if (!valid.ok()) return valid;
  return converted->matrices;
}

inline absl::Status CheckCreateJob(const v1::CreateJobRequest& request,
                                   const Limits& limits) {
  absl::StatusOr<JobSpec> converted = JobSpecFromProto(request.job());
  if (!converted.ok()) return converted.status();
  return ValidateCreateJob(request.request_id(), *converted, limits);
}

inline absl::Status CheckJoin(const v1::JoinJobRequest& request,
                              const Limits& limits) {
  return ValidateJoinJob(JoinRequestFromProto(request), limits);
}

}  // namespace validation_test
}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_VALIDATION_TEST_UTIL_H_
