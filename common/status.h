// Status helpers shared by every muonps component.
//
// Errors travel as absl::Status / absl::StatusOr values, never as exceptions.
// The status code is the category; the message names the offending thing, for
// example `matrix "layers.3.mlp.up": shape [0, 4096]: rows must be > 0`.
// These helpers keep that wording uniform. All functions are thread-safe.
#ifndef MUONPS_COMMON_STATUS_H_
#define MUONPS_COMMON_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace muonps {

// Returns a status with `code` whose message is "<field>: <what>".
// `code` must not be OK.
absl::Status FieldError(absl::StatusCode code, absl::string_view field,
                        absl::string_view what);

// Shorthand for FieldError(INVALID_ARGUMENT, field, what).
absl::Status InvalidField(absl::string_view field, absl::string_view what);

// Returns `status` with "<context>: " prepended to its message, keeping the
// code and payloads. OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// Quotes a user-supplied name for use in messages: `"layers.0.w"`. Names
// longer than 200 bytes are shortened with "..." so a hostile name cannot
// flood a log line.
std::string Quoted(absl::string_view name);

}  // namespace muonps

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define MUONPS_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    const ::absl::Status muonps_status_ = (expr);    \
    if (!muonps_status_.ok()) return muonps_status_; \
  } while (0)

#define MUONPS_STATUS_CONCAT_INNER_(a, b) a##b
#define MUONPS_STATUS_CONCAT_(a, b) MUONPS_STATUS_CONCAT_INNER_(a, b)

// `lhs` = value of the absl::StatusOr `expr`, or returns its status.
#define MUONPS_ASSIGN_OR_RETURN(lhs, expr) \
  MUONPS_ASSIGN_OR_RETURN_IMPL_(           \
      MUONPS_STATUS_CONCAT_(muonps_statusor_, __LINE__), lhs, expr)
#define MUONPS_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return statusor.status();            \
  lhs = std::move(statusor).value()

#endif  // MUONPS_COMMON_STATUS_H_
