// Newton-Schulz orthogonalization of one matrix on the CPU: dense NS5 and
// Gram NS (see kernels/README.md), in fp32 with OpenBLAS.
//
// Thread-compatible: a NsWorkspace belongs to one thread at a time.
#ifndef MUONPS_KERNELS_CPU_NEWTON_SCHULZ_H_
#define MUONPS_KERNELS_CPU_NEWTON_SCHULZ_H_

#include <cstdint>
#include <vector>

#include "newton_schulz/options.h"

namespace muonps {
namespace kernels {
namespace cpu {

// Scratch buffers reused across the matrices of a stack, so a stack of
// same-shape matrices allocates once.
class NsWorkspace {
 public:
  // Returns buffer `slot` with room for at least `elements` floats.
  float* Buffer(int slot, int64_t elements);

 private:
  std::vector<std::vector<float>> buffers_;
};

// out <- NS(in) for one rows x cols row-major matrix: normalize by
// max(margin * ||in||_F, eps), iterate on the wide orientation with the
// algorithm and coefficients of `options`, and restore the orientation.
// `out` may alias `in`. `options` must be valid
// (ValidateNewtonSchulzOptions).
void Orthogonalize(const float* in, int64_t rows, int64_t cols,
                   const NewtonSchulzOptions& options, float* out,
                   NsWorkspace* workspace);

}  // namespace cpu
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CPU_NEWTON_SCHULZ_H_
