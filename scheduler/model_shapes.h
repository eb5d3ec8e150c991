// Matrix lists of real model shapes (Llama-3-8B, a DeepSeek-V3-like MoE)
// and random ones, as planner inputs for the scheduler's tests and the
// benchmarks. Pure functions; thread-safe.
#ifndef MUONPS_SCHEDULER_MODEL_SHAPES_H_
#define MUONPS_SCHEDULER_MODEL_SHAPES_H_

#include <cstdint>
#include <vector>

#include "scheduler/plan_types.h"

namespace muonps {
namespace scheduler {

// Llama-3-8B: `layers` x (q, k, v, o, gate, up, down), bf16.
std::vector<MatrixSpec> Llama3_8B(int layers = 32);

// DeepSeek-V3-like: 61 layers of MLA attention; 3 dense MLP layers, then
// MoE layers of 256 routed experts x (gate, up, down) as 3-D stacks, a
// shared expert and a router. bf16.
std::vector<MatrixSpec> DeepSeekV3Like();

// `count` matrices with random dimensions, multiples of 64 in [64, 8192].
std::vector<MatrixSpec> RandomShapes(int count, uint32_t seed);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_MODEL_SHAPES_H_
