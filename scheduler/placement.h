// Internal to the planner: the algorithms that change an Assignment —
// greedy placement, local search by moves and swaps, and exact search for
// tiny instances. Deterministic; not thread-safe.
#ifndef MUONPS_SCHEDULER_PLACEMENT_H_
#define MUONPS_SCHEDULER_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/problem.h"

namespace muonps {
namespace scheduler {

// Items by decreasing standalone cost on the fastest worker class (ties by
// index): the longest-processing-time order.
std::vector<int> LptOrder(const Problem& problem);

// Places each unassigned item of `order`, in order, on the worker where it
// finishes earliest (counting batching with the same shape there) among
// those with room. RESOURCE_EXHAUSTED naming the matrix when none has room.
absl::Status PlaceGreedily(const std::vector<int>& order, Assignment* a);

// Places the unassigned `items` for memory first: largest first, each on
// the worker with the least free memory that still fits it (best-fit
// decreasing). RESOURCE_EXHAUSTED naming the matrix when one does not fit;
// items placed so far stay placed.
absl::Status PackByBytes(const std::vector<int>& items, Assignment* a);

struct SearchLimits {
  int max_improvements = 20000;
  // Stop as soon as the maximum load is at or below this (0: never).
  double target = 0;
  // Among improving moves prefer the one moving the fewest momentum bytes
  // (stable re-planning) rather than the one lowering the maximum most.
  bool fewest_bytes = false;
};

// Repeatedly moves one matrix off the most loaded worker, or swaps one of
// its matrices with one of a lightly loaded worker's, while that lowers the
// most loaded worker's load. Returns the number of changes made.
int ImproveByLocalSearch(const SearchLimits& limits, Assignment* a);

// Leaves each whole expert of a stack sharded on its experts with the
// worker whose trainer holds it (PlanInput::trainer_shards), wherever that
// costs nothing: the expert's owner swaps it for an item the holder owns
// and does not hold, of the same shape, owned bytes and link bytes, so
// every worker's batches, load and memory stay as they were. A holder that
// owns nothing of that kind (or may own nothing) leaves the expert where it
// is. Returns the number of swaps.
int LeaveExpertsWithHolders(Assignment* a);

// Per item of `problem`: the worker whose trainer holds it whole
// (PlanInput::trainer_shards), or -1 (none, not known, or a worker that
// may own nothing).
std::vector<int32_t> WholeExpertHolders(const Problem& problem);

// Assigns each unassigned item that a worker holds whole (WholeExpertHolders)
// to that worker where it has the memory. Returns how many.
int PinExpertsToHolders(Assignment* a);

// Where the workers span several nodes (PlanInput::nodes): the owners of
// `a` relabelled so that each node's workers own about as many link bytes
// as another's. Workers are interchangeable where they share a class (the
// same cost table, rates and speed), colocation (WorkerSpec::colocated) and
// whether they may own anything, whatever memory each had free; among each
// such set, the workers by owned link bytes, most first (ties: by index),
// each take the lowest free index of its set with room for its items on
// the node that owns the fewest link bytes so far (ties: the lowest node
// number). Where no index left has room, nothing is relabelled. Every worker
// keeps its items, batches and load, only under another index: the plan's
// Newton-Schulz is the same, and its transfers cross the nodes' network
// ports spread over the nodes rather than through the ports of the first
// nodes, which the greedy placement fills first (its ties go to the lowest
// index). By item, the new owner; `a`'s owners where the workers share one
// node, or where an item is held whole by a worker's trainer
// (WholeExpertHolders: its owner is where it is).
std::vector<int> SpreadOverNodes(const Assignment& a);

// When the instance is small (items <= max_items, workers^items <= 2e5),
// replaces `a` by an assignment minimizing the maximum load within memory,
// found by branch and bound, and returns true. `a` may be complete (its
// assignment is kept unless beaten) or empty. Returns false, leaving `a`,
// when the instance is too large or nothing fits.
bool SolveExactly(int max_items, Assignment* a);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_PLACEMENT_H_
