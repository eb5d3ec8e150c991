#include "server/worker/momentum_handover.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/step_control.h"

namespace muonps {
namespace worker {
namespace {

// What each rank broadcasts first.
struct HandoverHeader {
  int64_t previous_version = -1;
  int64_t last_step = -1;
  int64_t held = 0;
};

// What each rank broadcasts last: its lost items still without momentum,
// and the first of them (index into the plan's lost list; -1: none).
struct Unresolved {
  int64_t count = 0;
  int64_t first = -1;
};

// The previous owner of an item as the ranks told it: with owner groups,
// one of several (the first that holds its momentum), and every rank that
// holds it.
struct PreviousOwner {
  int rank = -1;  // -1: none among the ranks
  bool has_momentum = false;
  bool lost = false;
  int64_t as_of = kAsOfAny;
  int64_t outgoing_at = -1;  // on this rank, if it is a previous owner
  std::vector<int> holders;  // ranks that hold its momentum, in rank order
  bool older = false;        // held by ranks of an older version (see below)
};

}  // namespace

int64_t HandoverRoom(const MomentumStacks& now, const PreviousOwnership& before,
                     const MomentumStacks& next) {
  std::set<std::pair<int, int64_t>> moving;
  for (size_t i = 0; i < before.held.size(); ++i) {
    const HeldItem& item = before.held[i];
    if (before.outgoing_at[i] >= 0 &&
        next.slot(item.matrix, item.expert).batch < 0) {
      moving.emplace(item.matrix, item.expert);
    }
  }
  for (size_t m = 0; m < now.matrices.size(); ++m) {
    for (int64_t e = 0; e < now.matrices[m].experts; ++e) {
      if (now.slot(m, e).batch >= 0 && next.slot(m, e).batch < 0) {
        moving.emplace(static_cast<int>(m), e);
      }
    }
  }
  int64_t floats = 0;
  for (const auto& [m, e] : moving) {
    floats += now.matrices[m].rows * now.matrices[m].cols;
  }
  return floats;
}

absl::StatusOr<PreviousOwnership> KeepForHandover(
    const MomentumStacks& now, const PreviousOwnership& before,
    bool handed_over, const std::vector<std::pair<int, int64_t>>& lost_items,
    MomentumStacks& next, std::unique_ptr<kernels::FloatBuffer> room,
    kernels::DeviceOps& ops) {
  // Each held item with where its momentum is now (null: none).
  std::vector<std::pair<HeldItem, const float*>> items;
  PreviousOwnership previous;
  if (!handed_over || now.rank < 0) {
    // The installed version's handover never ran here, nor any of its
    // steps: this worker still holds what it held in the version before
    // (none for a worker that started since), and announces that (kept
    // items are in the installed stacks, moved ones in the outgoing
    // buffer).
    previous.version = before.version;
    for (size_t i = 0; i < before.held.size(); ++i) {
      const HeldItem& item = before.held[i];
      const ItemSlot slot = now.slot(item.matrix, item.expert);
      const float* at = nullptr;
      if (before.outgoing_at[i] >= 0) {
        at = before.outgoing->data() + before.outgoing_at[i];
      } else if (slot.batch >= 0 &&
                 item.has_momentum == HeldItem::kHasMomentum) {
        at = now.SlotData(slot);
      }
      items.emplace_back(item, at);
    }
  } else {
    previous.version = now.version;
    for (size_t m = 0; m < now.matrices.size(); ++m) {
      for (int64_t e = 0; e < now.matrices[m].experts; ++e) {
        const ItemSlot from = now.slot(m, e);
        if (from.batch < 0) continue;
        const bool has = now.has_momentum(from);
        const bool lost = std::find(lost_items.begin(), lost_items.end(),
                                    std::make_pair(static_cast<int>(m), e)) !=
                          lost_items.end();
        HeldItem item;
        item.matrix = static_cast<int32_t>(m);
        item.expert = static_cast<int32_t>(e);
        item.has_momentum = lost  ? HeldItem::kLostMomentum
                            : has ? HeldItem::kHasMomentum
                                  : HeldItem::kNoMomentum;
        item.as_of = now.stacks[from.batch].as_of[from.slot];
        items.push_back({item, has && !lost ? now.SlotData(from) : nullptr});
      }
    }
  }
  int64_t floats = 0;
  for (const auto& [item, at] : items) {
    previous.held.push_back(item);
    const scheduler::MatrixSpec& spec = now.matrices[item.matrix];
    const ItemSlot to = next.slot(item.matrix, item.expert);
    const bool moves = to.batch < 0;
    previous.outgoing_at.push_back(moves && at != nullptr ? floats : -1);
    if (moves && at != nullptr) floats += spec.rows * spec.cols;
    // Back here before its handover ran: from the outgoing buffer (what
    // the installed stacks held is in `next` already).
    if (!moves && at != nullptr && !next.has_momentum(to)) {
      MUONPS_RETURN_IF_ERROR(
          ops.Copy(next.SlotData(to), at, spec.rows * spec.cols, ops.stream()));
      next.stacks[to.batch].has_momentum[to.slot] = true;
      next.stacks[to.batch].as_of[to.slot] = item.as_of;
    }
  }
  if (floats == 0) return previous;
  if (room == nullptr || room->size() < floats) {
    return absl::InternalError(
        absl::StrCat("momentum handover: ", floats,
                     " floats of momentum move away; room was prepared for ",
                     room == nullptr ? 0 : room->size()));
  }
  previous.outgoing = std::move(room);
  for (size_t i = 0; i < items.size(); ++i) {
    if (previous.outgoing_at[i] < 0) continue;
    const scheduler::MatrixSpec& spec = now.matrices[items[i].first.matrix];
    MUONPS_RETURN_IF_ERROR(
        ops.Copy(previous.outgoing->data() + previous.outgoing_at[i],
                 items[i].second, spec.rows * spec.cols, ops.stream()));
  }
  return previous;
}

absl::Status HandOverMomentum(const HandoverContext& c,
                              HandoverOutcome* outcome) {
  MomentumStacks& stacks = *c.stacks;
  transport::Transport& t = *c.transport;
  kernels::DeviceOps& ops = *c.ops;
  ControlChannel control(&t, &ops, c.control, c.timeout);
  const int size = t.size();
  const PreviousOwnership& mine = *c.previous;
  auto transport_failed = [&](absl::Status status) {
    outcome->transport_ok = false;
    return Annotate(status, "momentum handover");
  };

  // 1. Every rank's previous version, last step and items, rank by rank.
  std::vector<HandoverHeader> headers(size);
  std::vector<std::vector<HeldItem>> held(size);
  for (int r = 0; r < size; ++r) {
    HandoverHeader& h = headers[r];
    if (r == stacks.rank) {
      h = {mine.version, c.last_step, static_cast<int64_t>(mine.held.size())};
    }
    if (absl::Status s = control.Broadcast(&h, r); !s.ok()) {
      return transport_failed(s);
    }
    if (h.held < 0 || h.held > (int64_t{1} << 28)) {
      return transport_failed(absl::DataLossError(
          absl::StrCat("rank ", r, " announced ", h.held, " items")));
    }
    held[r] = r == stacks.rank ? mine.held : std::vector<HeldItem>(h.held);
    if (h.held == 0) continue;
    if (absl::Status s = control.BroadcastBytes(
            held[r].data(), held[r].size() * sizeof(HeldItem), r);
        !s.ok()) {
      return transport_failed(s);
    }
  }
  int64_t previous_version = -1, last_step = -1;
  for (const HandoverHeader& h : headers) {
    previous_version = std::max(previous_version, h.previous_version);
    last_step = std::max(last_step, h.last_step);
  }

  // 2. The previous owner of every item, from the ranks that ran it.
  std::vector<std::vector<PreviousOwner>> previous(stacks.matrices.size());
  for (size_t m = 0; m < stacks.matrices.size(); ++m) {
    previous[m].resize(stacks.matrices[m].experts);
  }
  if (previous_version >= 0) {
    for (int r = 0; r < size; ++r) {
      if (headers[r].previous_version != previous_version) continue;
      for (size_t i = 0; i < held[r].size(); ++i) {
        const HeldItem& item = held[r][i];
        if (item.matrix < 0 ||
            item.matrix >= static_cast<int32_t>(previous.size()) ||
            item.expert < 0 ||
            item.expert >= static_cast<int32_t>(previous[item.matrix].size())) {
          return transport_failed(absl::DataLossError(
              absl::StrCat("rank ", r, " announced item ", item.matrix, "/",
                           item.expert, ", which is not in the job")));
        }
        // Several owner groups' owners report the same item: the first that
        // holds its momentum answers for it.
        PreviousOwner& owner = previous[item.matrix][item.expert];
        const bool has = item.has_momentum == HeldItem::kHasMomentum;
        if (has) owner.holders.push_back(r);
        if (r == stacks.rank) owner.outgoing_at = mine.outgoing_at[i];
        if (owner.rank >= 0 && (owner.has_momentum || !has)) continue;
        owner.rank = r;
        owner.has_momentum = has;
        owner.lost = item.has_momentum == HeldItem::kLostMomentum;
        owner.as_of = item.as_of;
      }
    }
    // An item the previous version holds no momentum of (lost, or reset
    // and never stepped since) that a rank of an older version still holds
    // as of the job's step: a worker that was dropped while paused past its
    // lease, when no step committed without it. Its momentum is current.
    for (int r = 0; r < size; ++r) {
      const HandoverHeader& h = headers[r];
      if (h.previous_version < 0 || h.previous_version >= previous_version ||
          h.last_step != last_step) {
        continue;
      }
      for (size_t i = 0; i < held[r].size(); ++i) {
        const HeldItem& item = held[r][i];
        if (item.has_momentum != HeldItem::kHasMomentum || item.matrix < 0 ||
            item.matrix >= static_cast<int32_t>(previous.size()) ||
            item.expert < 0 ||
            item.expert >= static_cast<int32_t>(previous[item.matrix].size())) {
          continue;
        }
        PreviousOwner& owner = previous[item.matrix][item.expert];
        if (owner.has_momentum && !owner.older) continue;
        if (!owner.has_momentum) {
          owner = PreviousOwner{};
          owner.rank = r;
          owner.has_momentum = true;
          owner.older = true;
          owner.as_of = item.as_of;
        }
        owner.holders.push_back(r);
        if (r == stacks.rank) owner.outgoing_at = mine.outgoing_at[i];
      }
    }
  }

  // 3. The transfers, in (matrix, expert, owner group) order; then the lost
  // items. Each owner that does not hold an item's momentum gets it from a
  // holder in its own owner group if there is one (on its node), else from
  // the first holder.
  const scheduler::OwnerGroups groups(stacks.groups, size);
  std::unique_ptr<kernels::FloatBuffer> discard, zeros;
  std::vector<ItemSlot> arrived;
  std::vector<std::pair<int, int64_t>> lost;
  for (size_t m = 0; m < stacks.matrices.size(); ++m) {
    const int64_t floats = stacks.matrices[m].rows * stacks.matrices[m].cols;
    for (int64_t e = 0; e < stacks.matrices[m].experts; ++e) {
      const PreviousOwner& from = previous[m][e];
      if (from.rank < 0 || from.lost) {
        if (last_step >= 0 || from.lost) {
          lost.emplace_back(static_cast<int>(m), e);
        }
        continue;
      }
      if (!from.has_momentum) continue;
      for (int g = 0; g < groups.count(); ++g) {
        const int owner = groups.OwnerIn(stacks.owners[m][e], g);
        if (std::find(from.holders.begin(), from.holders.end(), owner) !=
            from.holders.end()) {
          continue;  // it holds the momentum already
        }
        int source = from.rank;
        for (const int h : from.holders) {
          if (groups.group_of(h) == g) {
            source = h;
            break;
          }
        }
        if (source == stacks.rank) {
          // Still an owner here (of another group): from its own slot;
          // else from what it kept to hand over.
          const ItemSlot here = stacks.slot(static_cast<int>(m), e);
          const float* data = nullptr;
          if (here.batch >= 0) {
            data = stacks.SlotData(here);
          } else if (mine.outgoing != nullptr && from.outgoing_at >= 0) {
            data = mine.outgoing->data() + from.outgoing_at;
          } else {
            return absl::InternalError(absl::StrCat(
                "momentum handover: matrix ", Quoted(stacks.matrices[m].name),
                " expert ", e, " moved away but was not kept to hand over"));
          }
          if (absl::Status s =
                  t.Send(data, floats, DType::kFloat32, owner, ops.stream());
              !s.ok()) {
            return transport_failed(s);
          }
          ++outcome->sent;
          continue;
        }
        if (owner != stacks.rank) continue;
        const ItemSlot slot = stacks.slots[m][e];
        MomentumStack& batch = stacks.stacks[slot.batch];
        float* into = stacks.SlotData(slot);
        if (!c.first) {  // already here (and maybe stepped since)
          if (discard == nullptr || discard->size() < floats) {
            MUONPS_ASSIGN_OR_RETURN(
                discard, ops.Allocate(floats, "handed-over momentum"));
          }
          into = discard->data();
        }
        if (absl::Status s =
                t.Recv(into, floats, DType::kFloat32, source, ops.stream());
            !s.ok()) {
          return transport_failed(s);
        }
        if (c.first) {
          batch.has_momentum[slot.slot] = true;
          batch.as_of[slot.slot] = from.as_of;
          arrived.push_back(slot);
          ++outcome->received;
        }
      }
    }
  }
  if (absl::Status s = t.Synchronize(ops.stream(), c.timeout); !s.ok()) {
    return transport_failed(s);
  }
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  // A step staged in doubt here commits its next_momentum: it must hold
  // the arrived momentum too.
  for (const ItemSlot& slot : arrived) {
    MomentumStack& batch = stacks.stacks[slot.batch];
    if (!batch.next_valid) continue;
    MUONPS_RETURN_IF_ERROR(ops.Copy(batch.next_at(slot.slot),
                                    stacks.SlotData(slot), batch.floats(),
                                    ops.stream()));
    batch.next_has_momentum[slot.slot] = true;
    batch.next_as_of[slot.slot] = batch.as_of[slot.slot];
  }
  outcome->lost = static_cast<int64_t>(lost.size());
  outcome->job_step = last_step;
  Unresolved unresolved;
  if (c.first) {
    for (size_t i = 0; i < lost.size(); ++i) {
      const auto [m, e] = lost[i];
      if (!groups.Owns(stacks.rank, stacks.owners[m][e])) continue;
      const ItemSlot slot = stacks.slots[m][e];
      MomentumStack& batch = stacks.stacks[slot.batch];
      const int64_t floats = batch.floats();
      float* into = stacks.SlotData(slot);
      const absl::Status loaded = c.checkpoint
                                      ? c.checkpoint(m, e, into, last_step)
                                      : absl::NotFoundError("no checkpoint");
      if (loaded.ok()) {
        batch.has_momentum[slot.slot] = true;
        batch.as_of[slot.slot] = last_step;
        ++outcome->restored;
      } else if (!absl::IsNotFound(loaded)) {
        return Annotate(loaded, absl::StrCat("momentum of matrix ",
                                             Quoted(stacks.matrices[m].name),
                                             " expert ", e));
      } else {
        // Whatever SetPlan kept here is from an older version: zero.
        if (zeros == nullptr || zeros->size() < floats) {
          MUONPS_ASSIGN_OR_RETURN(zeros, ops.Allocate(floats, "zeros"));
        }
        MUONPS_RETURN_IF_ERROR(
            ops.Copy(into, zeros->data(), floats, ops.stream()));
        batch.has_momentum[slot.slot] = false;
        batch.as_of[slot.slot] = kAsOfAny;
        if (stacks.allow_momentum_reset) {
          ++outcome->reset;
        } else {
          if (unresolved.count++ == 0) unresolved.first = i;
          if (c.unresolved != nullptr) c.unresolved->emplace_back(m, e);
        }
      }
      if (batch.next_valid) {
        MUONPS_RETURN_IF_ERROR(
            ops.Copy(batch.next_at(slot.slot), into, floats, ops.stream()));
        batch.next_has_momentum[slot.slot] = batch.has_momentum[slot.slot];
        batch.next_as_of[slot.slot] = batch.as_of[slot.slot];
      }
    }
    MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  }

  // 4. Whether any rank is left with a lost item: then none steps.
  int64_t total = 0, first = -1;
  for (int r = 0; r < size; ++r) {
    Unresolved u = unresolved;
    if (absl::Status s = control.Broadcast(&u, r); !s.ok()) {
      return transport_failed(s);
    }
    total += u.count;
    if (u.first >= 0 && (first < 0 || u.first < first)) first = u.first;
  }
  if (total == 0) return absl::OkStatus();
  if (first < 0 || first >= static_cast<int64_t>(lost.size())) {
    return absl::DataLossError(
        "momentum handover: the ranks disagree on the lost items");
  }
  const auto [m, e] = lost[first];
  return FieldError(
      absl::StatusCode::kFailedPrecondition,
      absl::StrCat("matrix ", Quoted(stacks.matrices[m].name)),
      absl::StrCat(
          "expert ", e, " lost its momentum in plan version ", stacks.version,
          ": its previous owner left the job and no checkpoint holds it (",
          total, total == 1 ? " matrix" : " matrices",
          " in all); set JobSpec.allow_momentum_reset to start them from "
          "zero"));
}

}  // namespace worker
}  // namespace muonps
