// The GPU worker's backend: CudaKernels (cuBLAS Newton-Schulz) and
// CudaDeviceOps on one CUDA device, both ordered on one stream the ops
// own, and the trainer's buffers opened by CUDA IPC. Plus the device's
// identity for the coordinator.
#ifndef MUONPS_SERVER_WORKER_CUDA_STEP_BACKEND_H_
#define MUONPS_SERVER_WORKER_CUDA_STEP_BACKEND_H_

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kernels/cuda/precision.h"
#include "muonps/v1/types.pb.h"
#include "server/worker/step_engine.h"

namespace muonps {
namespace worker {

struct CudaBackendOptions {
  int device = 0;
  // Newton-Schulz GEMM inputs (fp32 accumulation); torch.optim.Muon: bf16.
  kernels::cuda::Precision precision = kernels::cuda::Precision::kBf16;
  absl::Duration timeout = absl::Seconds(10);
};

// UNAVAILABLE without a usable GPU; FAILED_PRECONDITION below sm_90.
absl::StatusOr<StepBackend> CudaStepBackend(const CudaBackendOptions& options);

// True if a CUDA device with this ordinal can be used (never crashes on a
// machine without a driver).
bool CudaDeviceUsable(int device);
// The CUDA devices this process sees; 0 without a driver.
int CudaDevices();

// Fills kind "cuda", name, index, uuid and (if unset) memory_bytes with the
// device's free memory. UNAVAILABLE naming the device on failure.
absl::Status DescribeCudaDevice(int device, v1::Device* out);

// Opens CUDA IPC buffers lent for device `device`: INVALID_ARGUMENT naming
// `device` when the request lends another device's (or host) memory.
TrainerBuffersOpener CudaIpcBuffersOpener(int device);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_CUDA_STEP_BACKEND_H_
