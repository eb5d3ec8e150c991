// The ownership planner: which worker owns (and orthogonalizes) each matrix,
// batched by shape, so that the predicted slowest worker finishes as early
// as possible.
//
// Costs come from each worker's CostModel and are batching-aware: k
// same-shape matrices on one owner run as one batch, so a worker's load is
// sum over its shapes of T(shape, k) plus per-matrix transfer time, not a
// sum of per-matrix costs. T(shape, k) is the fastest way to run the batch
// (BatchSplitter): one call, or the split into smaller calls that the
// worker's measured times favour, which the plan's Batch::parts record. The
// plan starts from longest-processing-time greedy placement (and from FLOP-LPT,
// keeping the better), improves the most loaded worker with moves and swaps,
// and solves tiny instances exactly. Deterministic: equal inputs give equal
// plans, field for field.
//
// The lower bound reported with a plan is max(total work / total speed,
// largest single matrix on its fastest worker), where total work batches
// every shape on one worker (the cheapest way to run it).
//
// Functions are thread-safe (they share no state).
#ifndef MUONPS_SCHEDULER_PLANNER_H_
#define MUONPS_SCHEDULER_PLANNER_H_

#include "absl/status/statusor.h"
#include "scheduler/plan_types.h"
#include "scheduler/problem.h"

namespace muonps {
namespace scheduler {

// Plans from scratch. INVALID_ARGUMENT / RESOURCE_EXHAUSTED naming the
// matrix or worker for bad input (see ValidatePlanInput), and
// RESOURCE_EXHAUSTED naming the matrix and the worker with the most free
// memory when the matrices do not fit together.
absl::StatusOr<OwnershipPlan> PlanOwnership(const PlanInput& input);

// Plans for a changed worker set or matrix list, moving as little momentum
// as it can: matrices stay with their previous owner (matched by matrix
// name and worker id) where that owner remains; the rest are placed
// greedily; then the cheapest moves (fewest bytes) run until the predicted
// maximum is within options.replan_tolerance of a fresh plan's, or no move
// helps. moved_bytes counts the momentum that changed owner.
absl::StatusOr<OwnershipPlan> Replan(const PlanInput& input,
                                     const OwnershipPlan& previous);

// PlanOwnership, with moved_bytes counted against `previous`: for a changed
// worker set or matrix list whose momentum does not exist yet (no step has
// run), where keeping owners buys nothing and Replan's kept owners would
// leave the imbalance of the order the workers came in (3-8% of the
// busiest worker's Newton-Schulz on 2-8 GPUs joining one at a time).
absl::StatusOr<OwnershipPlan> PlanAfresh(const PlanInput& input,
                                         const OwnershipPlan& previous);

// Peers, evaluated with the same cost model for comparison: greedy LPT on
// dense NS5 FLOPs ignoring batching and speed (DMuon's released planner),
// and size-sorted round-robin (KellerJordan/Muon, DeepSpeed ZeRO-3).
// Neither checks memory.
absl::StatusOr<OwnershipPlan> PlanFlopLpt(const PlanInput& input);
absl::StatusOr<OwnershipPlan> PlanRoundRobin(const PlanInput& input);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_PLANNER_H_
