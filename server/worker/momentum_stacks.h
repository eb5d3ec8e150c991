// MomentumStacks: the momentum of the matrices (experts) a worker owns in
// one plan version, on its device, in the step schedule's same-shape stacks
// (so that a step updates a whole stack in one batched call), each with the
// staged step's new momentum beside it. Plain data and the operations on
// it; MomentumStore owns the installed version and says who may touch it
// when. Thread-compatible.
#ifndef MUONPS_SERVER_WORKER_MOMENTUM_STACKS_H_
#define MUONPS_SERVER_WORKER_MOMENTUM_STACKS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/device_ops.h"
#include "scheduler/plan_types.h"
#include "server/worker/checkpoint_writer.h"

namespace muonps {
namespace worker {

// Where an owned item sits: its stack (the plan's compute batch) and slot
// in it; batch < 0: not owned here.
struct ItemSlot {
  int batch = -1;
  int slot = 0;
};

// One owned stack of the schedule (scheduler::OwnerStack).
// MomentumStack::as_of of momentum valid before any step: zero in a job that
// has not stepped, a reset the job allows, or written by a caller (the
// trainer's own saved state).
constexpr int64_t kAsOfAny = -2;

struct MomentumStack {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<scheduler::ItemRef> items;  // stack order
  // fp32, on the device, items.size() x rows x cols; zero until stepped.
  std::unique_ptr<kernels::FloatBuffer> momentum;
  std::vector<bool> has_momentum;  // per slot: stepped, handed or restored
  // Per slot: the last step whose update its momentum holds, or kAsOfAny.
  // A step S stages only on momentum as of S - 1 (MomentumStore::
  // CheckMomentumStep): momentum handed over by a worker that missed a
  // step, or restored from an older checkpoint, is never stepped silently.
  std::vector<int64_t> as_of;
  // The staged step's new momentum (valid while next_valid), swapped with
  // `momentum` when the step commits.
  std::unique_ptr<kernels::FloatBuffer> next_momentum;
  std::vector<bool> next_has_momentum;
  std::vector<int64_t> next_as_of;
  bool next_valid = false;

  int64_t floats() const { return rows * cols; }  // of one slot
  float* at(int slot) const { return momentum->data() + slot * floats(); }
  float* next_at(int slot) const {
    return next_momentum->data() + slot * floats();
  }
};

// A plan version's momentum owned here. The caller fills the layout (the
// fields up to `stacks`' rows, cols and items); Allocate the rest.
struct MomentumStacks {
  int64_t version = -1;  // -1: none yet
  int rank = -1;         // this worker's rank; -1: not in the plan
  std::vector<scheduler::MatrixSpec> matrices;  // the job's, in job order
  // Owner rank by matrix, expert (scheduler::OwnershipPlan::owners: the
  // first owner group's), and the plan's owner groups (its groups; empty:
  // one group of every rank).
  std::vector<scheduler::ItemOwners> owners;
  std::vector<std::vector<int32_t>> groups;
  std::vector<MomentumStack> stacks;  // the compute batches owned here
  // The job's: where momentum checkpoints go ("": none) and every how many
  // committed steps (0: only when asked); whether a matrix whose momentum
  // was lost starts from zero (else its steps fail).
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool allow_momentum_reset = false;
  // Filled by Allocate: where each owned item sits, by matrix, expert.
  std::vector<std::vector<ItemSlot>> slots;

  // Builds `slots` from the stacks' items and allocates each stack's
  // momentum and next_momentum (zero-filled, flags clear). Slow for large
  // stacks: call it with no lock held. RESOURCE_EXHAUSTED naming the
  // buffer when the device is full; INVALID_ARGUMENT for an item outside
  // `matrices`.
  absl::Status Allocate(kernels::DeviceOps& ops);
  // Where (matrix, expert) sits; batch < 0 when not owned here (or out of
  // range).
  ItemSlot slot(int64_t matrix, int64_t expert) const;
  // The matrix named `name` (-1: not in the job).
  int MatrixIndex(const std::string& name) const;
  // The momentum of an owned slot (device memory, rows x cols floats).
  float* SlotData(const ItemSlot& s) const {
    return stacks[s.batch].at(s.slot);
  }
  bool has_momentum(const ItemSlot& s) const {
    return stacks[s.batch].has_momentum[s.slot];
  }
  // Copies the momentum of every item owned in both `old` and here into
  // these stacks (same job: same matrices), in stream order. With
  // `carry_staged` (a step staged in doubt, which may still commit) the
  // staged step's new momentum comes along into next_momentum, and every
  // stack's next_valid is set.
  absl::Status CarryFrom(const MomentumStacks& old, bool carry_staged,
                         kernels::DeviceOps& ops);
  // Whether `other` has the same matrices (names and shapes) in the same
  // order: its items are this job's.
  bool SameJob(const MomentumStacks& other) const;
  // Which momentum OwnedToHost copies: the committed one, or the staged
  // step's new momentum (next_momentum, before its vote).
  enum class Which { kCommitted, kStaged };
  // The momentum of every owned item that holds some, copied to host
  // memory (job order; a checkpoint's tensors). Waits for the stream.
  // kStaged: FAILED_PRECONDITION when an owning stack holds no staged step.
  absl::StatusOr<std::vector<SnapshotTensor>> OwnedToHost(
      kernels::DeviceOps& ops, Which which = Which::kCommitted) const;
  // Swaps every valid next_momentum in (a commit) / forgets them (a drop).
  void CommitNext();
  void DropNext();
};

// Momentum of owned experts in host memory, checked against a version
// and ready to write into its stacks (MomentumStore::Check, ReadCheckpoint).
struct CheckedMomentum {
  struct Expert {
    std::string matrix;
    int64_t expert = 0;
    std::vector<float> values;  // rows x cols
  };
  std::vector<Expert> experts;
  int64_t version = -1;  // the plan version it was checked against
  // From a checkpoint: its step (-1: from a caller) and directory.
  int64_t checkpoint_step = -1;
  std::string checkpoint_dir;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_MOMENTUM_STACKS_H_
