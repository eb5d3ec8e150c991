#include "transport/nccl_status.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace transport {
namespace nccl {

// System and remote errors are a lost or failing peer or network; the rest
// (CUDA errors, internal errors, misuse) are ours or the library's.
absl::StatusCode CodeFor(ncclResult_t result) {
  return result == ncclSystemError || result == ncclRemoteError
             ? absl::StatusCode::kUnavailable
             : absl::StatusCode::kInternal;
}

void Pause(absl::Duration* pause) {
  absl::SleepFor(*pause);
  *pause = std::min(*pause * 2, kLongestPause);
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

// NCCL's error string, with its last error message where it has one.
std::string NcclText(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0')
    absl::StrAppend(&text, " (", last, ")");
  return text;
}

absl::Status NcclStatus(ncclResult_t result, absl::string_view what,
                        ncclComm_t comm) {
  return absl::Status(CodeFor(result),
                      absl::StrCat(what, ": ", NcclText(result, comm)));
}

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (error == cudaErrorMemoryAllocation) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (error == cudaErrorNoDevice ||
             error == cudaErrorInsufficientDriver) {
    code = absl::StatusCode::kUnavailable;
  }
  return absl::Status(code, absl::StrCat(what, ": ", cudaGetErrorName(error),
                                         ": ", cudaGetErrorString(error)));
}

}  // namespace nccl
}  // namespace transport
}  // namespace muonps
