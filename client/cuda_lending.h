// The CUDA side of a client that lends device memory: exporting a buffer
// for the worker (CUDA IPC) and waiting for the trainer's stream before a
// step. Only GPU trainers call these; a host-only trainer never touches
// the CUDA runtime. Thread-safe.
#ifndef MUONPS_CLIENT_CUDA_LENDING_H_
#define MUONPS_CLIENT_CUDA_LENDING_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"
#include "muonps/v1/worker.pb.h"

namespace muonps {
namespace client_internal {

// The IPC handle and offset of `elements` floats at `data`, which must be
// device memory of `device`. INVALID_ARGUMENT naming `what` otherwise.
absl::StatusOr<v1::CudaBuffer> ExportCudaBuffer(const float* data,
                                                int64_t elements,
                                                const Device& device,
                                                const std::string& what);

// Waits until `stream` (kHostStream: the whole device) has done its work.
absl::Status WaitForTrainerStream(const Device& device, Stream stream);

}  // namespace client_internal
}  // namespace muonps

#endif  // MUONPS_CLIENT_CUDA_LENDING_H_
