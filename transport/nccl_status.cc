#include "transport/nccl_status.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace transport {
namespace nccl {

namespace {

// The enumerator's name, as cudaGetErrorName gives CUDA's; NCCL has no such
// call.
const char* ResultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult_t(unknown)";
  }
}

}  // namespace

absl::StatusCode CodeFor(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return absl::StatusCode::kOk;
    case ncclSystemError:
    case ncclRemoteError:
      return absl::StatusCode::kUnavailable;
    case ncclInvalidArgument:
      return absl::StatusCode::kInvalidArgument;
    default:
      return absl::StatusCode::kInternal;
  }
}

Clock::time_point DeadlineAfter(absl::Duration timeout) {
  // Clamped so that an infinite timeout cannot overflow the clock.
  const absl::Duration bounded =
      std::clamp(timeout, absl::ZeroDuration(), absl::Hours(24 * 365));
  return Clock::now() + absl::ToChronoNanoseconds(bounded);
}

bool Accepted(ncclResult_t result) {
  return result == ncclSuccess || result == ncclInProgress;
}

std::string NcclText(ncclResult_t result, ncclComm_t comm) {
  std::string text =
      absl::StrCat(ResultName(result), ": ", ncclGetErrorString(result));
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0')
    absl::StrAppend(&text, " (", last, ")");
  return text;
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view what,
                        ncclComm_t comm) {
  if (result == ncclSuccess) return absl::OkStatus();
  return absl::Status(CodeFor(result),
                      absl::StrCat(what, ": ", NcclText(result, comm)));
}

}  // namespace nccl
}  // namespace transport
}  // namespace muonps
