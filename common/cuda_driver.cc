// Driver error names and the stream memory operations on 64-bit words
// (cuda_driver.h).
#include "common/cuda_driver.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/strings/str_cat.h"

namespace muonps {
namespace {

// Makes `stream` wait until the word at `device_address` compares to
// `value` as `condition` (a CUstreamWaitValue_flags) says.
absl::Status StreamWaitValue(Stream stream, const void* device_address,
                             uint64_t value, unsigned int condition) {
  MUONPS_ASSIGN_OR_RETURN(
      PFN_cuStreamWaitValue64_v11070 wait,
      DriverEntryPoint<PFN_cuStreamWaitValue64_v11070>("cuStreamWaitValue64"));
  const CUresult result =
      wait(reinterpret_cast<CUstream>(stream),
           reinterpret_cast<CUdeviceptr>(device_address), value, condition);
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cuStreamWaitValue64: ", DriverErrorText(result)));
}

}  // namespace

std::string DriverErrorText(CUresult result) {
  std::string text = absl::StrCat("CUresult ", static_cast<int>(result));
  absl::StatusOr<PFN_cuGetErrorName_v6000> name_of =
      DriverEntryPoint<PFN_cuGetErrorName_v6000>("cuGetErrorName");
  const char* name = nullptr;
  if (name_of.ok() && (*name_of)(result, &name) == CUDA_SUCCESS &&
      name != nullptr) {
    absl::StrAppend(&text, " (", name, ")");
  }
  return text;
}

absl::Status StreamWriteValue(Stream stream, void* device_address,
                              uint64_t value) {
  MUONPS_ASSIGN_OR_RETURN(PFN_cuStreamWriteValue64_v11070 write,
                          DriverEntryPoint<PFN_cuStreamWriteValue64_v11070>(
                              "cuStreamWriteValue64"));
  const CUresult result = write(reinterpret_cast<CUstream>(stream),
                                reinterpret_cast<CUdeviceptr>(device_address),
                                value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (result == CUDA_SUCCESS) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cuStreamWriteValue64: ", DriverErrorText(result)));
}

absl::Status StreamWaitAtLeast(Stream stream, const void* device_address,
                               uint64_t value) {
  return StreamWaitValue(stream, device_address, value,
                         CU_STREAM_WAIT_VALUE_GEQ);
}

absl::Status StreamWaitEqual(Stream stream, const void* device_address,
                             uint64_t value) {
  return StreamWaitValue(stream, device_address, value,
                         CU_STREAM_WAIT_VALUE_EQ);
}

}  // namespace muonps
