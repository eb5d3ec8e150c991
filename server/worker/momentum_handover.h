// The momentum handover: when a plan version moves a matrix (an expert) to
// a new owner, its momentum goes from the previous owner to the new one over
// the new plan's transport, before any step of the new version, so that
// training goes on exactly as if nothing had moved (docs/architecture.md).
//
// When it runs. StepEngine runs one handover (MomentumStore::HandOver)
// right after it builds the
// transport of a plan version, on every rank (trainers' workers in Step,
// dedicated ones in FollowStep), before the first round on that transport.
// A transport rebuilt within the same version (a lost peer, a re-attached
// trainer, a new secret) runs it again with the same messages: senders keep
// what they hand over for the whole version, and a rank that already has an
// item drops the second copy. So every rank issues the same calls in the
// same order whatever happened to the others.
//
// Who sends what. No rank knows the previous plan of the others (a worker
// that joined never saw it), so every rank first broadcasts (rank order)
// its previous plan version (-1: none), its last committed step and the
// items it owned in that version, with whether each has momentum. The
// previous plan is the newest version any rank reports; only ranks that
// report it are trusted (a rank that missed a version holds stale
// momentum), except for an item that version holds no momentum of: a rank
// of an older version whose last committed step is the job's still holds
// it current (a worker dropped while paused past its lease, when no step
// committed without it), and hands it over. A worker announces a version only
// once its handover ran there (a restarted worker that was handed a plan
// announces nothing, so what its old process owned counts as lost); versions
// that ended before their handover ran (no step either) pass on what was held
// before them. Then, in (matrix, expert) order, every item whose previous owner
// is another rank of the new plan and has momentum moves from it to its new
// owner (Send and Recv, no group: both ends issue the pairs in the one global
// order, so none deadlocks). A pure function of what the ranks broadcast, so
// every rank computes the same transfers.
//
// Owner groups (scheduler::OwnershipPlan::groups). Each group's owners hold
// a copy of every item's momentum, so several ranks report an item. In
// (matrix, expert, group) order, each new owner that holds no copy gets one
// from a holder in its own group (its node) if there is one, else from the
// first holder, which sends it from its own slot if it still owns the item
// in another group: a node that joins gets every item from the nodes that
// stayed, and an item is lost only when every copy is.
//
// Lost items. An item with no previous owner among the ranks, in a job that
// has stepped (some rank committed a step), lost its momentum (its owner
// left or died); so did one its previous owner reports lost. Its new owner asks
// the checkpoint (MomentumSource: the job's checkpoint_dir, only momentum
// as of the newest step any rank committed), and failing that starts it
// from zero when the job allows it (JobSpec.allow_momentum_reset). The ranks
// then broadcast how many stay unresolved; any makes every rank's handover
// FAILED_PRECONDITION naming the first such matrix, the same on every rank.
//
// The step each item's momentum holds travels with it (HeldItem::as_of). The
// old owner hands over its committed momentum: when a step it held staged in
// doubt across the plan change (voted, no decision) commits elsewhere, what
// it sent is a step behind, and the new owner's next step reads that item
// again from the checkpoint of the step before (MomentumStore::
// CheckMomentumStep) or starts it from zero, counted as a reset; never
// silently.
#ifndef MUONPS_SERVER_WORKER_MOMENTUM_HANDOVER_H_
#define MUONPS_SERVER_WORKER_MOMENTUM_HANDOVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kernels/device_ops.h"
#include "server/worker/momentum_stacks.h"
#include "transport/transport.h"

namespace muonps {
namespace worker {

// One item a worker owned in a plan version, as broadcast (24 bytes).
struct HeldItem {
  int32_t matrix = 0;
  int32_t expert = 0;
  // kNoMomentum, kHasMomentum, or kLostMomentum: it was lost in that
  // version and never resolved (a strict job's failed handover), so it
  // stays lost wherever it moves.
  int32_t has_momentum = 0;
  int32_t unused = 0;
  // The last step its momentum holds (MomentumStack::as_of): the new owner
  // keeps it, so that a worker that missed a step hands over momentum that
  // the next step refuses to use as current.
  int64_t as_of = kAsOfAny;
  static constexpr int32_t kNoMomentum = 0, kHasMomentum = 1, kLostMomentum = 2;
};
static_assert(sizeof(HeldItem) == 24, "HeldItem is broadcast as bytes");

// What a worker keeps of its previous plan version until the next one:
// the items it owned (sorted by matrix, expert) and the momentum of those
// it no longer owns, to hand over. Built by MomentumStore::Install.
struct PreviousOwnership {
  int64_t version = -1;  // -1: none (a new worker, or not in that plan)
  std::vector<HeldItem> held;
  // Momentum of the held items that moved away, back to back in `held`
  // order; outgoing_at[i] is held[i]'s offset (-1: not handed over).
  std::unique_ptr<kernels::FloatBuffer> outgoing;
  std::vector<int64_t> outgoing_at;
};

// Loads the momentum of (matrix, expert) into `slot` (device memory of the
// item's size) from somewhere other than its previous owner, as of step
// `step` (the newest step any rank committed): OK once written, NOT_FOUND
// when there is none of that step.
using MomentumSource = std::function<absl::Status(int matrix, int64_t expert,
                                                  float* slot, int64_t step)>;

// What a handover runs with; everything must outlive the call.
struct HandoverContext {
  MomentumStacks* stacks = nullptr;  // the new version's, owned here
  // Device memory for the control messages (ControlChannel's scratch).
  kernels::FloatBuffer* control = nullptr;
  const PreviousOwnership* previous = nullptr;
  transport::Transport* transport = nullptr;
  kernels::DeviceOps* ops = nullptr;
  int64_t last_step = -1;  // committed here
  // False on a rerun within the version: items already here stay as they
  // are (a second copy is dropped) and nothing is counted as lost again.
  bool first = true;
  absl::Duration timeout;
  MomentumSource checkpoint;
  // Receives the items owned here whose momentum stays lost (by matrix,
  // expert), for the next version's handover to say so.
  std::vector<std::pair<int, int64_t>>* unresolved = nullptr;
};

// How a handover ended on this rank.
struct HandoverOutcome {
  // False: the transport failed mid-way (rebuild it; the handover reruns).
  bool transport_ok = true;
  int64_t sent = 0;       // items handed to their new owners from here
  int64_t received = 0;   // items whose momentum arrived here
  int64_t restored = 0;   // lost items loaded from the checkpoint here
  int64_t reset = 0;      // lost items started from zero here (allowed)
  int64_t lost = 0;       // items of the whole plan with no previous owner
  int64_t job_step = -1;  // the newest step any rank committed (-1: none)
};

// Floats of momentum that KeepForHandover may keep for `next` (its room):
// every item held now (in `now`'s stacks, or still waiting in `before`'s
// outgoing buffer) that `next` does not own. Same job in both.
int64_t HandoverRoom(const MomentumStacks& now, const PreviousOwnership& before,
                     const MomentumStacks& next);

// What the installed version `now` leaves for the handover to `next` (same
// job), its outgoing momentum copied into `room` (HandoverRoom's size) in
// `ops`' stream order. With `handed_over` (`now`'s handover ran here) that
// is the items owned in `now`, `lost_items` among them announced as lost;
// without, what was held before (`before`): a worker announces a version
// only once its handover ran there. Items of `next` that come back here
// before their handover ran get their momentum back at once. INTERNAL when
// `room` is too small.
absl::StatusOr<PreviousOwnership> KeepForHandover(
    const MomentumStacks& now, const PreviousOwnership& before,
    bool handed_over, const std::vector<std::pair<int, int64_t>>& lost_items,
    MomentumStacks& next, std::unique_ptr<kernels::FloatBuffer> room,
    kernels::DeviceOps& ops);

// Runs the handover (see above). OK, or: the transport's error (with
// transport_ok false); FAILED_PRECONDITION naming the first matrix whose
// momentum is lost and how many are, when the job does not allow resets.
absl::Status HandOverMomentum(const HandoverContext& context,
                              HandoverOutcome* outcome);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_MOMENTUM_HANDOVER_H_
