// FLOP counts of the Newton-Schulz variants, for benchmarks (executed
// TFLOP/s) and for the scheduler's cost model when nothing was measured.
//
// Counts are multiply-adds times two. A product that computes one triangle
// of a symmetric result counts half of the dense product. Pure functions.
#ifndef MUONPS_NEWTON_SCHULZ_FLOPS_H_
#define MUONPS_NEWTON_SCHULZ_FLOPS_H_

#include <cstdint>

#include "newton_schulz/options.h"

namespace muonps {

// FLOPs the algorithm of `options` executes on one rows x cols matrix with
// one-triangle symmetric products (NS5: X X^T and A^2; Gram NS: every
// m x m product), as the CPU and CUDA backends run it.
double NsExecutedFlops(int64_t rows, int64_t cols,
                       const NewtonSchulzOptions& options);

// FLOPs of textbook dense NS5 (every product a full GEMM), the yardstick
// "NS5-equivalent" rates are quoted against: steps * (4 m^2 n + 2 m^3).
double Ns5DenseFlops(int64_t rows, int64_t cols, int steps);

}  // namespace muonps

#endif  // MUONPS_NEWTON_SCHULZ_FLOPS_H_
