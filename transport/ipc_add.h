// out[i] <- out[i] + part[i] (fp32, round to nearest) on `stream`: the
// accumulation step of CudaIpcTransport's ReduceSum. Device pointers;
// returns the launch error. Thread-safe.
#ifndef MUONPS_TRANSPORT_IPC_ADD_H_
#define MUONPS_TRANSPORT_IPC_ADD_H_

#include <cuda_runtime.h>

#include <cstddef>

namespace muonps {
namespace transport {

cudaError_t LaunchAddInto(float* out, const float* part, size_t count,
                          cudaStream_t stream);

}  // namespace transport
}  // namespace muonps

#endif  // MUONPS_TRANSPORT_IPC_ADD_H_
