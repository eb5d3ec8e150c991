// Internal to the planner: a validated planning problem in flat arrays
// (items = single 2-D matrices, shapes, worker classes with their cost
// models) and a mutable Assignment of items to workers that keeps every
// worker's predicted load current as items move.
//
// Not thread-safe (Problem memoizes batch times lazily).
#ifndef MUONPS_SCHEDULER_PROBLEM_H_
#define MUONPS_SCHEDULER_PROBLEM_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace scheduler {

struct PlanInput {
  std::vector<MatrixSpec> matrices;
  std::vector<WorkerSpec> workers;
  PlanOptions options;
  // What the workers' trainers hold (by worker index, as `workers`): where
  // known, each whole expert of a stack sharded on its experts is left with
  // the worker whose trainer holds it, wherever that costs nothing
  // (LeaveExpertsWithHolders).
  TrainerShards trainer_shards;
  // The node (host) of each worker (by worker index, as `workers`),
  // numbered from 0. Empty: one node. Across nodes a fresh plan deals the
  // loads of interchangeable workers over the nodes (SpreadOverNodes).
  std::vector<int32_t> nodes;
};

// INVALID_ARGUMENT naming the matrix or worker: empty or duplicate names,
// dimensions < 1 or > 2^31, experts < 1, no workers, speed <= 0, memory
// <= 0, bad options; RESOURCE_EXHAUSTED naming a matrix that no worker has
// the memory to own, or (field "matrices") where the workers that may own
// hold less than the matrices need together.
absl::Status ValidatePlanInput(const PlanInput& input);

class Problem {
 public:
  // `input` must outlive the Problem and be valid (ValidatePlanInput).
  explicit Problem(const PlanInput& input);
  // Its batch splitters point at its own cost models.
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  int num_items() const { return static_cast<int>(items_.size()); }
  int num_workers() const { return static_cast<int>(worker_class_.size()); }
  int num_shapes() const { return static_cast<int>(shapes_.size()); }

  const PlanInput& input() const { return input_; }
  const ItemRef& item(int i) const { return items_[i]; }
  int shape_of(int i) const { return item_shape_[i]; }
  int64_t rows(int shape) const { return shapes_[shape].rows; }
  int64_t cols(int shape) const { return shapes_[shape].cols; }
  int64_t owned_bytes(int i) const { return owned_bytes_[i]; }
  int64_t momentum_bytes(int i) const { return momentum_bytes_[i]; }
  int64_t link_bytes(int i) const { return link_bytes_[i]; }
  int64_t capacity(int w) const { return capacity_[w]; }
  int worker_class(int w) const { return worker_class_[w]; }
  int num_classes() const { return static_cast<int>(models_.size()); }
  const CostModel& model(int c) const { return models_[c]; }

  // Predicted NS seconds of `n` items of `shape` batched on a worker of
  // class `c`: one call with the best algorithm the options allow, or the
  // split into several calls its measured times favour (BatchSplitter).
  double BatchSeconds(int c, int shape, int64_t n) const {
    return splitters_[c][shape].Seconds(n);
  }
  // The calls that achieve it (BatchSplitter::Parts).
  scheduler::BatchParts BatchParts(int c, int shape, int64_t n) const {
    return splitters_[c][shape].Parts(n);
  }
  // Transfer seconds of item `i` on a worker of class `c`.
  double TransferSeconds(int c, int i) const;
  // Standalone cost of item `i` on the fastest class.
  double BestStandalone(int i) const;

  // max(total work / total speed, largest single item): see planner.h.
  // `work` is Work(), which the caller has (it prices every shape at every
  // count up to its number, on every class: not to be done twice).
  double LowerBound(double work) const;
  // The least Newton-Schulz seconds of every item at speed 1 (a class's
  // seconds times its speed): each shape's items at the cheapest
  // per-matrix time of any batch up to their number, on the class where
  // that is least. Workers of total speed S compute them in no less than
  // Work() / S, however they are placed.
  double Work() const;

 private:
  struct Shape {
    int64_t rows;
    int64_t cols;
  };
  const PlanInput& input_;
  std::vector<ItemRef> items_;
  std::vector<int> item_shape_;
  std::vector<int64_t> owned_bytes_, momentum_bytes_, link_bytes_;
  std::vector<Shape> shapes_;
  std::vector<int> shape_count_;
  std::vector<int> worker_class_;
  std::vector<double> class_speed_sum_;
  std::vector<CostModel> models_;
  std::vector<int64_t> capacity_;
  // splitters_[c][shape]: memoized over the batch size, grown on demand.
  mutable std::vector<std::vector<BatchSplitter>> splitters_;
  // one_seconds_[c][shape]: BatchSeconds(c, shape, 1), read densely.
  std::vector<std::vector<double>> one_seconds_;
};

// Items on workers, grouped per (worker, shape) into slots, with every
// worker's load kept current. Items of a slot form a linked list (newest
// first); nothing allocates per item, and lookups never iterate hash maps,
// so results do not depend on hashing.
class Assignment {
 public:
  struct Slot {
    int worker = -1;
    int shape = -1;
    int64_t count = 0;
    int newest = -1;  // an item of the slot; older ones via older_than()
    // The shape's predicted seconds batched count - 1, count and count + 1
    // times on the worker's class (what LoadWith and LoadWithout add and
    // take away, kept as the count changes).
    double fewer = 0, now = 0, more = 0;
  };

  explicit Assignment(const Problem& problem);

  const Problem& problem() const { return problem_; }
  int owner(int item) const { return owner_[item]; }
  double load(int w) const { return load_[w]; }
  double total_load() const { return total_load_; }
  int64_t used_bytes(int w) const { return used_bytes_[w]; }
  int64_t free_bytes(int w) const {
    return problem_.capacity(w) - used_bytes_[w];
  }
  int64_t count(int w, int shape) const;
  // Slot ids on worker w, in the order their shapes arrived.
  const std::vector<int>& slots_on(int w) const { return slots_on_[w]; }
  const Slot& slot(int id) const { return slots_[id]; }
  // The next older item of the same slot, or -1.
  int older_than(int item) const { return older_[item]; }
  // Slots of `shape`: the workers holding at least one item of it.
  const std::vector<int>& holder_slots(int shape) const {
    return holder_slots_[shape];
  }

  // Load of w after adding item i / removing item i (which w holds).
  double LoadWith(int w, int item) const;
  double LoadWithout(int w, int item) const;
  // LoadWith for the worker of slot `id`, whose shape is item i's (no
  // lookup: what placement asks of every holder of a shape).
  double LoadWithOnSlot(int id, int item) const;
  bool Fits(int w, int item) const {
    return problem_.owned_bytes(item) <= free_bytes(w);
  }

  void Assign(int item, int w);
  void Unassign(int item);
  // Index of the most loaded worker (lowest index on ties).
  int MaxWorker() const;
  double MaxLoad() const { return load_[MaxWorker()]; }

 private:
  static int64_t Key(int w, int shape) {
    return (static_cast<int64_t>(w) << 32) | static_cast<uint32_t>(shape);
  }
  int SlotOf(int w, int shape) const;
  double ShapeSeconds(int w, int shape, int64_t n) const;
  // Sets the slot's fewer, now and more for its count; after the count grew
  // or shrank by one, from the ones it had.
  void Price(Slot& slot) const;
  void PriceOneMore(Slot& slot) const;
  void PriceOneFewer(Slot& slot) const;

  const Problem& problem_;
  std::vector<int> owner_;
  std::vector<int> older_, newer_;  // per item: links within its slot
  std::vector<double> load_;
  double total_load_ = 0;
  std::vector<int64_t> used_bytes_;
  std::vector<Slot> slots_;
  std::vector<int> free_slots_;
  absl::flat_hash_map<int64_t, int> slot_index_;
  std::vector<std::vector<int>> slots_on_;
  std::vector<std::vector<int>> holder_slots_;
};

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_PROBLEM_H_
