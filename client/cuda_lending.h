// The CUDA side of a client that lends device memory: exporting a buffer
// for the worker (CUDA IPC) and waiting for the trainer's stream before a
// step. Only GPU trainers call these; a host-only trainer never touches
// the CUDA runtime. Thread-safe.
#ifndef MUONPS_CLIENT_CUDA_LENDING_H_
#define MUONPS_CLIENT_CUDA_LENDING_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/device.h"
#include "common/dtype.h"
#include "lending/cuda_ipc.h"
#include "muonps/v1/worker.pb.h"

namespace muonps {
namespace client_internal {

// The IPC handle and offset of `elements` values of `dtype` at `data`,
// which must be device memory of `device`. INVALID_ARGUMENT naming `what`
// otherwise.
absl::StatusOr<v1::CudaBuffer> ExportCudaBuffer(const void* data,
                                                int64_t elements, DType dtype,
                                                const Device& device,
                                                const std::string& what);

// How a CUDA trainer and its worker order a step without host waits: the
// trainer records `ready` on its stream after the gradients and makes its
// stream wait until the done counter (a word of its device memory) reaches
// step_id + 1, which the worker's stream writes when the step is done or
// refused. If the worker cannot (it died, the RPC failed), Release writes
// the counter from here so the trainer's stream never hangs.
// Thread-compatible; Release may run on another thread than BeforeStep.
class CudaStepSignals {
 public:
  static absl::StatusOr<std::unique_ptr<CudaStepSignals>> Create(
      const Device& device);
  ~CudaStepSignals();
  CudaStepSignals(const CudaStepSignals&) = delete;
  CudaStepSignals& operator=(const CudaStepSignals&) = delete;

  // The event, the counter and the step record, for the worker.
  absl::Status Describe(v1::AttachRequest* request) const;
  // On `stream`: record ready, then wait for the done counter.
  absl::Status BeforeStep(Stream stream, int64_t step_id);
  // Sets the done counter to step_id + 1 from the host.
  absl::Status Release(int64_t step_id);

 private:
  CudaStepSignals(const Device& device, IpcEvent ready)
      : device_(device), ready_(std::move(ready)) {}
  const Device device_;
  IpcEvent ready_;
  uint64_t* done_ = nullptr;        // device word
  uint64_t* host_value_ = nullptr;  // pinned
  CUstream_st* release_stream_ = nullptr;
};

}  // namespace client_internal
}  // namespace muonps

#endif  // MUONPS_CLIENT_CUDA_LENDING_H_
