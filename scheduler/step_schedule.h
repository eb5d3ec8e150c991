// The step schedule: which matrices travel together (buckets, in reverse
// layer order, as backward produces gradients) and the one order in which
// every worker issues the transfers of a step.
//
// Every transfer is a collective among all workers rooted at the matrix's
// owner, so all workers must issue the same transfers in the same order or
// NCCL deadlocks; the schedule is a pure function of the matrices and the
// plan, so every worker computes the same one. Thread-compatible.
#ifndef MUONPS_SCHEDULER_STEP_SCHEDULE_H_
#define MUONPS_SCHEDULER_STEP_SCHEDULE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/plan_types.h"

namespace muonps {
namespace scheduler {

enum class TransferKind {
  kReduceToOwner,       // unreduced gradients: sum (mean) onto the owner
  kGatherToOwner,       // row-sharded gradients: row ranges onto the owner
  kBroadcastFromOwner,  // the update, to every rank (replicated, unreduced)
  kScatterFromOwner,    // the update's row ranges back (row_sharded)
};

absl::string_view TransferKindName(TransferKind kind);

struct Transfer {
  TransferKind kind = TransferKind::kBroadcastFromOwner;
  ItemRef item;
  int32_t owner = 0;  // index into the plan's worker_ids
  int64_t bytes = 0;  // the whole matrix's payload
};

struct Bucket {
  // Matrices (all their experts) in the order their gradients arrive.
  std::vector<int32_t> matrices;
  int32_t first_layer = 0;  // highest layer in the bucket
  int32_t last_layer = 0;   // lowest
  int64_t bytes = 0;        // gradient payload of the bucket
  // Gradients to owners (none for replicated matrices), then updates back.
  std::vector<Transfer> to_owners;
  std::vector<Transfer> from_owners;
};

// One entry of the issue order: a bucket's gradients to the owners, or its
// updates back from them.
struct Phase {
  int32_t bucket = 0;
  bool to_owners = true;
};

struct StepSchedule {
  std::vector<Bucket> buckets;
  // to_owners(0), then for k >= 1: to_owners(k), from_owners(k - 1); then
  // from_owners(last). Gradients of bucket k + 1 move while bucket k
  // computes.
  std::vector<Phase> order;
};

struct ScheduleOptions {
  // A bucket closes before it would exceed this many gradient bytes; a
  // single larger matrix gets a bucket of its own.
  int64_t bucket_bytes = int64_t{64} << 20;
};

// INVALID_ARGUMENT naming the field if bucket_bytes <= 0 or `plan` does not
// belong to `matrices` (names, expert counts, owners out of range).
absl::StatusOr<StepSchedule> BuildStepSchedule(
    const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
    const ScheduleOptions& options = {});

// Every transfer in issue order: what each worker walks through per step.
std::vector<Transfer> IssueOrder(const StepSchedule& schedule);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_STEP_SCHEDULE_H_
