// Symmetric matrix products on the CPU (OpenBLAS), each computing one
// triangle and mirroring it, for the Newton-Schulz iterations.
//
// All matrices are row-major fp32 and square m x m unless said otherwise;
// outputs must not alias inputs. Functions are thread-compatible (they share
// no state), and run OpenBLAS's own threads inside.
#ifndef MUONPS_KERNELS_CPU_SYMMETRIC_OPS_H_
#define MUONPS_KERNELS_CPU_SYMMETRIC_OPS_H_

#include <cstdint>

namespace muonps {
namespace kernels {
namespace cpu {

// out (m x m) <- x x^T for x of shape m x n (ssyrk, then mirror).
void GramMatrix(const float* x, int64_t m, int64_t n, float* out);

// out <- a a for symmetric a (ssyrk on a, since a a = a a^T).
void SymmetricSquare(const float* a, int64_t m, float* out);

// out <- a b for symmetric a and b that commute, so the product is
// symmetric: only the lower block-trapezoid is multiplied (about half the
// FLOPs of a dense product), then mirrored.
void CommutingProduct(const float* a, const float* b, int64_t m, float* out);

// Copies the lower triangle of a onto its upper triangle.
void MirrorLower(float* a, int64_t m);

}  // namespace cpu
}  // namespace kernels
}  // namespace muonps

#endif  // MUONPS_KERNELS_CPU_SYMMETRIC_OPS_H_
