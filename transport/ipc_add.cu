#include "transport/ipc_add.h"

namespace muonps {
namespace transport {
namespace {

__global__ void AddIntoKernel(float* out, const float* part, size_t count) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
       i < count; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = __fadd_rn(out[i], part[i]);
  }
}

}  // namespace

cudaError_t LaunchAddInto(float* out, const float* part, size_t count,
                          cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  size_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > 65535) blocks = 65535;
  AddIntoKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      out, part, count);
  return cudaGetLastError();
}

}  // namespace transport
}  // namespace muonps
