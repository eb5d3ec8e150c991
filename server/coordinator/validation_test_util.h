// What the request validation tests share (request_validation.h): the
// IsFieldError matcher, SmallLimits (limits small enough to reach), and
// NaN and infinity. Tests only (testonly in BUILD).
#ifndef MUONPS_SERVER_COORDINATOR_VALIDATION_TEST_UTIL_H_
#define MUONPS_SERVER_COORDINATOR_VALIDATION_TEST_UTIL_H_

#include <limits>
#include <string>

#include "gmock/gmock.h"
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

}  // namespace validation_test
}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_VALIDATION_TEST_UTIL_H_
