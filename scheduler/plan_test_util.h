// What the ownership planner's tests share (planner.h): ExpectValidPlan,
// every field of a plan recomputed from its input and CostModel; random
// valid instances (RandomInput); exhaustive search on tiny ones
// (BruteForce); and the Worker and CountOn helpers. Tests only (testonly in
// BUILD).
#ifndef MUONPS_SCHEDULER_PLAN_TEST_UTIL_H_
#define MUONPS_SCHEDULER_PLAN_TEST_UTIL_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "scheduler/cost_table.h"
#include "scheduler/planner.h"

namespace muonps {
namespace scheduler {
namespace plan_test {

// The planner sums a worker's seconds in another order than these tests:
// 1e-9 relative is far above the rounding of a few hundred terms and far
// below any difference between two placements.
constexpr double kRel = 1e-9;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int kRandomInstances = 300;

// Bytes of fp32 momentum of one expert of `m`.
int64_t MomentumBytes(const MatrixSpec& m);

// Everything a plan of `input` must satisfy, recomputed from the input.
void ExpectValidPlan(const PlanInput& input, const OwnershipPlan& plan);

// ---- Random instances ----

int64_t Uniform(std::mt19937& rng, int64_t lo, int64_t hi);
double UniformReal(std::mt19937& rng, double lo, double hi);
bool Chance(std::mt19937& rng, double p);

struct InstanceLimits {
  int max_matrices = 40;
  int max_workers = 12;
  int max_experts = 8;
  int max_distinct_shapes = 6;
  // Else every worker has room for everything.
  bool tight_memory_allowed = true;
};

// A random valid instance: shapes drawn from a small pool (so batching
// matters) and fresh ones, random experts, layouts, dtypes and layers;
// workers with mixed speeds, tables and links; memory roomy or tight.
PlanInput RandomInput(uint32_t seed, const InstanceLimits& limits);

// ---- Exhaustive search on tiny instances (one expert per matrix) ----

struct Optimum {
  bool feasible = false;
  double max_seconds = std::numeric_limits<double>::infinity();
};

// Tries all workers^matrices assignments that fit in memory.
Optimum BruteForce(const PlanInput& input);

// ---- Builders ----

WorkerSpec Worker(const std::string& id, int64_t memory_bytes,
                  double speed = 1.0,
                  std::shared_ptr<const CostTable> costs = nullptr);

// How many items (matrices or experts) `worker` owns in `plan`.
int CountOn(const OwnershipPlan& plan, int32_t worker);

}  // namespace plan_test
}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_PLAN_TEST_UTIL_H_
