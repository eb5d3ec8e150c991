// StepEngine's setup of a new plan version: its stacks, the momentum
// that stays with its owner, and what moves away kept for the handover
// (step_engine_transport.cc runs it). A trainer's attachment is in
// step_engine_attach.cc.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/step_engine.h"

namespace muonps {
namespace worker {
namespace {

// Floats the control messages of a step need in transport memory.
constexpr int64_t kControlFloats = 1024;

}  // namespace

absl::Status StepEngine::SetPlan(
    const JobPlan& plan, const std::map<std::string, std::string>& addresses) {
  PlanState next;
  next.job = plan.job;
  next.version = plan.membership.version;
  next.matrices = plan.job.matrices;
  next.muon = plan.job.muon;
  next.ownership = plan.ownership;
  const std::vector<std::string>& workers = plan.membership.workers;
  for (size_t r = 0; r < workers.size(); ++r) {
    if (workers[r] == worker_id_) next.rank = static_cast<int>(r);
    auto it = addresses.find(workers[r]);
    next.addresses.push_back(it == addresses.end() ? "" : it->second);
  }
  MUONPS_ASSIGN_OR_RETURN(
      next.schedule,
      scheduler::BuildStepSchedule(next.matrices, next.ownership,
                                   {.bucket_bytes = plan.job.bucket_bytes}));
  next.slots.resize(next.matrices.size());
  for (size_t m = 0; m < next.matrices.size(); ++m) {
    next.slots[m].assign(next.matrices[m].experts, ItemSlot{});
  }
  int64_t largest = kControlFloats;
  for (const scheduler::MatrixSpec& spec : next.matrices) {
    largest = std::max(largest, spec.rows * spec.cols);
  }
  // The schedule's stacks this worker owns become its compute batches.
  next.batch_of_stack.assign(next.schedule.stacks.size(), -1);
  for (size_t k = 0; k < next.schedule.stacks.size(); ++k) {
    const scheduler::OwnerStack& stack = next.schedule.stacks[k];
    if (stack.owner != next.rank) continue;
    next.batch_of_stack[k] = static_cast<int>(next.batches.size());
    ComputeBatch batch;
    batch.rows = stack.rows;
    batch.cols = stack.cols;
    batch.items = stack.items;
    batch.chunks = stack.chunks;
    for (size_t slot = 0; slot < stack.items.size(); ++slot) {
      const scheduler::ItemRef& item = stack.items[slot];
      next.slots[item.matrix][item.expert] = {next.batch_of_stack[k],
                                              static_cast<int>(slot)};
    }
    next.batches.push_back(std::move(batch));
  }
  absl::MutexLock lock(&mu_);
  kernels::DeviceOps& ops = *backend_.ops;
  for (ComputeBatch& batch : next.batches) {
    const int64_t floats =
        static_cast<int64_t>(batch.items.size()) * batch.rows * batch.cols;
    MUONPS_ASSIGN_OR_RETURN(batch.staged,
                            ops.Allocate(floats, "staged gradients"));
    MUONPS_ASSIGN_OR_RETURN(batch.momentum, ops.Allocate(floats, "momentum"));
    MUONPS_ASSIGN_OR_RETURN(batch.next_momentum,
                            ops.Allocate(floats, "staged momentum"));
    batch.has_momentum.assign(batch.items.size(), false);
    batch.next_has_momentum.assign(batch.items.size(), false);
  }
  MUONPS_ASSIGN_OR_RETURN(next.scratch, ops.Allocate(largest, "scratch"));
  // Momentum of items this worker keeps owning moves to the new stacks; so
  // does a step staged in doubt (its new momentum), which may still commit.
  const bool carry = ledger_.staged.voted;
  const bool same_job = plan_.matrices.size() == next.matrices.size();
  for (size_t m = 0; m < next.matrices.size(); ++m) {
    for (int64_t e = 0; e < next.matrices[m].experts; ++e) {
      const ItemSlot& to = next.slots[m][e];
      if (to.batch < 0) continue;
      const ItemSlot from =
          same_job && e < static_cast<int64_t>(plan_.slots[m].size())
              ? plan_.slots[m][e]
              : ItemSlot{};
      const ComputeBatch* old =
          from.batch >= 0 ? &plan_.batches[from.batch] : nullptr;
      const bool staged = carry && old != nullptr && old->next_valid &&
                          old->next_has_momentum[from.slot];
      // Moved here: the handover brings it (momentum_handover.h).
      if (old == nullptr || (!old->has_momentum[from.slot] && !staged)) {
        continue;
      }
      ComputeBatch& nb = next.batches[to.batch];
      const int64_t size = nb.rows * nb.cols;
      const int64_t at = static_cast<int64_t>(from.slot) * size;
      MUONPS_RETURN_IF_ERROR(ops.Copy(next.SlotData(to, true),
                                      old->momentum->data() + at, size,
                                      ops.stream()));
      nb.has_momentum[to.slot] = old->has_momentum[from.slot];
      if (carry) {
        const kernels::FloatBuffer& source =
            old->next_valid ? *old->next_momentum : *old->momentum;
        MUONPS_RETURN_IF_ERROR(
            ops.Copy(nb.next_momentum->data() + to.slot * size,
                     source.data() + at, size, ops.stream()));
        nb.next_has_momentum[to.slot] = old->next_valid
                                            ? old->next_has_momentum[from.slot]
                                            : old->has_momentum[from.slot];
      }
    }
  }
  for (ComputeBatch& batch : next.batches) batch.next_valid = carry;
  // What moves away waits here for the handover. The same version set
  // again keeps what its handover needs.
  PreviousOwnership previous;
  if (next.version == plan_.version) {
    previous = std::move(previous_);
  } else if (same_job) {
    MUONPS_ASSIGN_OR_RETURN(previous, KeepForHandover(next));
  }
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  // The transport of the old version goes first: its pending work may
  // still name the old buffers. Aborted, not finalized: a finalize waits
  // for peers that may be gone.
  DropTransport(absl::CancelledError(
      absl::StrCat("plan version ", next.version, " replaced it")));
  if (next.version != plan_.version) {
    handed_over_version_ = -1;
    handover_failed_ = absl::OkStatus();
    lost_items_.clear();
  }
  plan_ = std::move(next);
  previous_ = std::move(previous);
  PublishPlan();
  return absl::OkStatus();
}

absl::StatusOr<PreviousOwnership> StepEngine::KeepForHandover(PlanState& next) {
  kernels::DeviceOps& ops = *backend_.ops;
  // Each held item with where its momentum is now (null: none).
  std::vector<std::pair<HeldItem, const float*>> items;
  PreviousOwnership previous;
  if (handed_over_version_ != plan_.version || plan_.rank < 0) {
    // The current version's handover never ran here, nor any of its steps:
    // this worker still holds what it held in the version before (none
    // for a worker that started since), and announces that (kept items are
    // in the current stacks, moved ones in the outgoing buffer).
    previous.version = previous_.version;
    for (size_t i = 0; i < previous_.held.size(); ++i) {
      const HeldItem& item = previous_.held[i];
      const ItemSlot now = plan_.slots[item.matrix][item.expert];
      const float* at = nullptr;
      if (previous_.outgoing_at[i] >= 0) {
        at = previous_.outgoing->data() + previous_.outgoing_at[i];
      } else if (now.batch >= 0 &&
                 item.has_momentum == HeldItem::kHasMomentum) {
        at = plan_.SlotData(now, true);
      }
      items.emplace_back(item, at);
    }
  } else {
    previous.version = plan_.version;
    for (size_t m = 0; m < plan_.matrices.size(); ++m) {
      for (int64_t e = 0; e < plan_.matrices[m].experts; ++e) {
        const ItemSlot from = plan_.slots[m][e];
        if (from.batch < 0) continue;
        const bool has = plan_.batches[from.batch].has_momentum[from.slot];
        const bool lost = std::find(lost_items_.begin(), lost_items_.end(),
                                    std::make_pair(static_cast<int>(m), e)) !=
                          lost_items_.end();
        items.push_back({{static_cast<int32_t>(m), static_cast<int32_t>(e),
                          lost  ? HeldItem::kLostMomentum
                          : has ? HeldItem::kHasMomentum
                                : HeldItem::kNoMomentum},
                         has && !lost ? plan_.SlotData(from, true) : nullptr});
      }
    }
  }
  int64_t floats = 0;
  for (const auto& [item, at] : items) {
    previous.held.push_back(item);
    const int64_t size =
        plan_.matrices[item.matrix].rows * plan_.matrices[item.matrix].cols;
    const bool moves =
        item.expert >= static_cast<int64_t>(next.slots[item.matrix].size()) ||
        next.slots[item.matrix][item.expert].batch < 0;
    previous.outgoing_at.push_back(moves && at != nullptr ? floats : -1);
    if (moves && at != nullptr) floats += size;
    // Back here before its handover ran: from the outgoing buffer (what
    // the current stacks held is in `next` already).
    if (!moves && at != nullptr) {
      const ItemSlot to = next.slots[item.matrix][item.expert];
      ComputeBatch& batch = next.batches[to.batch];
      if (!batch.has_momentum[to.slot]) {
        MUONPS_RETURN_IF_ERROR(
            ops.Copy(next.SlotData(to, true), at, size, ops.stream()));
        batch.has_momentum[to.slot] = true;
      }
    }
  }
  if (floats == 0) return previous;
  MUONPS_ASSIGN_OR_RETURN(previous.outgoing,
                          ops.Allocate(floats, "momentum to hand over"));
  for (size_t i = 0; i < items.size(); ++i) {
    if (previous.outgoing_at[i] < 0) continue;
    const HeldItem& item = items[i].first;
    MUONPS_RETURN_IF_ERROR(ops.Copy(
        previous.outgoing->data() + previous.outgoing_at[i], items[i].second,
        plan_.matrices[item.matrix].rows * plan_.matrices[item.matrix].cols,
        ops.stream()));
  }
  return previous;
}

}  // namespace worker
}  // namespace muonps
