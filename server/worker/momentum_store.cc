// MomentumStore's versions (Prepare, Install and what moves between them),
// the staged step's swap, and one expert's reads and writes. Checkpoints
// are in momentum_store_checkpoint.cc, the handover in
// momentum_store_handover.cc.
#include "server/worker/momentum_store.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

MomentumStore::MomentumStore(std::string worker_id, kernels::DeviceOps* ops)
    : worker_id_(std::move(worker_id)),
      ops_(ops),
      stacks_(std::make_unique<MomentumStacks>()) {}

MomentumStore::~MomentumStore() {
  if (writer_ != nullptr) writer_->WaitIdle().IgnoreError();
}

absl::StatusOr<PreparedMomentum> MomentumStore::Prepare(
    MomentumStacks layout) const {
  PreparedMomentum next;
  next.stacks = std::move(layout);
  MUONPS_RETURN_IF_ERROR(next.stacks.Allocate(*ops_));
  // Room for what may move away: every item held now (in the stacks, or
  // still waiting in the outgoing buffer for a handover that never ran)
  // that `next` does not own.
  int64_t room = 0;
  {
    absl::MutexLock lock(&mu_);
    next.installs = installs_;
    const MomentumStacks& now = *stacks_;
    if (next.stacks.version == now.version || !next.stacks.SameJob(now)) {
      return next;
    }
    std::set<std::pair<int, int64_t>> moving;
    for (size_t i = 0; i < previous_.held.size(); ++i) {
      const HeldItem& item = previous_.held[i];
      if (previous_.outgoing_at[i] >= 0 &&
          next.stacks.slot(item.matrix, item.expert).batch < 0) {
        moving.emplace(item.matrix, item.expert);
      }
    }
    for (size_t m = 0; m < now.matrices.size(); ++m) {
      for (int64_t e = 0; e < now.matrices[m].experts; ++e) {
        if (now.slot(m, e).batch >= 0 && next.stacks.slot(m, e).batch < 0) {
          moving.emplace(static_cast<int>(m), e);
        }
      }
    }
    for (const auto& [m, e] : moving) {
      room += now.matrices[m].rows * now.matrices[m].cols;
    }
  }
  if (room > 0) {
    MUONPS_ASSIGN_OR_RETURN(next.outgoing,
                            ops_->Allocate(room, "momentum to hand over"));
  }
  return next;
}

absl::Status MomentumStore::Install(PreparedMomentum next, bool carry_staged) {
  // Freed once the lock is released.
  std::unique_ptr<MomentumStacks> old;
  PreviousOwnership replaced;
  absl::MutexLock lock(&mu_);
  if (next.installs != installs_) {
    return FieldError(absl::StatusCode::kFailedPrecondition, "plan",
                      absl::StrCat("plan version ", stacks_->version,
                                   " was installed since version ",
                                   next.stacks.version, " was prepared"));
  }
  MomentumStacks& now = *stacks_;
  MUONPS_RETURN_IF_ERROR(next.stacks.CarryFrom(now, carry_staged, *ops_));
  // What moves away waits for the handover. The same version set again
  // keeps what its handover needs.
  const bool same_version = next.stacks.version == now.version;
  PreviousOwnership previous;
  if (!same_version && next.stacks.SameJob(now)) {
    MUONPS_ASSIGN_OR_RETURN(
        previous, KeepForHandover(next.stacks, std::move(next.outgoing)));
  }
  MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
  if (same_version) {
    previous = std::move(previous_);
  } else {
    handed_over_version_ = -1;
    handover_failed_ = absl::OkStatus();
    lost_items_.clear();
  }
  replaced = std::exchange(previous_, std::move(previous));
  old = std::exchange(stacks_,
                      std::make_unique<MomentumStacks>(std::move(next.stacks)));
  ++installs_;
  return absl::OkStatus();
}

absl::StatusOr<PreviousOwnership> MomentumStore::KeepForHandover(
    MomentumStacks& next, std::unique_ptr<kernels::FloatBuffer> room) {
  const MomentumStacks& now = *stacks_;
  // Each held item with where its momentum is now (null: none).
  std::vector<std::pair<HeldItem, const float*>> items;
  PreviousOwnership previous;
  if (handed_over_version_ != now.version || now.rank < 0) {
    // The installed version's handover never ran here, nor any of its
    // steps: this worker still holds what it held in the version before
    // (none for a worker that started since), and announces that (kept
    // items are in the installed stacks, moved ones in the outgoing
    // buffer).
    previous.version = previous_.version;
    for (size_t i = 0; i < previous_.held.size(); ++i) {
      const HeldItem& item = previous_.held[i];
      const ItemSlot slot = now.slot(item.matrix, item.expert);
      const float* at = nullptr;
      if (previous_.outgoing_at[i] >= 0) {
        at = previous_.outgoing->data() + previous_.outgoing_at[i];
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
        const bool lost = std::find(lost_items_.begin(), lost_items_.end(),
                                    std::make_pair(static_cast<int>(m), e)) !=
                          lost_items_.end();
        items.push_back({{static_cast<int32_t>(m), static_cast<int32_t>(e),
                          lost  ? HeldItem::kLostMomentum
                          : has ? HeldItem::kHasMomentum
                                : HeldItem::kNoMomentum},
                         has && !lost ? now.SlotData(from) : nullptr});
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
      MUONPS_RETURN_IF_ERROR(ops_->Copy(next.SlotData(to), at,
                                        spec.rows * spec.cols, ops_->stream()));
      next.stacks[to.batch].has_momentum[to.slot] = true;
    }
  }
  if (floats == 0) return previous;
  if (room == nullptr || room->size() < floats) {
    return absl::InternalError(
        absl::StrCat("worker ", Quoted(worker_id_), ": ", floats,
                     " floats of momentum move away; room was prepared for ",
                     room == nullptr ? 0 : room->size()));
  }
  previous.outgoing = std::move(room);
  for (size_t i = 0; i < items.size(); ++i) {
    if (previous.outgoing_at[i] < 0) continue;
    const scheduler::MatrixSpec& spec = now.matrices[items[i].first.matrix];
    MUONPS_RETURN_IF_ERROR(
        ops_->Copy(previous.outgoing->data() + previous.outgoing_at[i],
                   items[i].second, spec.rows * spec.cols, ops_->stream()));
  }
  return previous;
}

MomentumStacks& MomentumStore::installed() {
  absl::MutexLock lock(&mu_);
  return *stacks_;
}

int64_t MomentumStore::version() const {
  absl::MutexLock lock(&mu_);
  return stacks_->version;
}

void MomentumStore::CommitStaged() {
  absl::MutexLock lock(&mu_);
  stacks_->CommitNext();
}

void MomentumStore::DropStaged() {
  absl::MutexLock lock(&mu_);
  stacks_->DropNext();
}

absl::Status MomentumStore::NoPlan() const {
  return FieldError(absl::StatusCode::kFailedPrecondition, "plan",
                    absl::StrCat("worker ", Quoted(worker_id_),
                                 " has no plan yet (or is not in it)"));
}

absl::StatusOr<ItemSlot> MomentumStore::OwnedSlot(const std::string& matrix,
                                                  int64_t expert) const {
  const int m = stacks_->MatrixIndex(matrix);
  if (m < 0) {
    return FieldError(absl::StatusCode::kNotFound, "matrix",
                      absl::StrCat(Quoted(matrix), " is not in the job"));
  }
  const ItemSlot slot = stacks_->slot(m, expert);
  if (slot.batch < 0) {
    return FieldError(
        absl::StatusCode::kNotFound, "matrix",
        absl::StrCat(Quoted(matrix), " expert ", expert,
                     " is not owned by worker ", Quoted(worker_id_)));
  }
  return slot;
}

absl::StatusOr<std::vector<float>> MomentumStore::Get(const std::string& matrix,
                                                      int64_t expert) const {
  absl::MutexLock lock(&mu_);
  MUONPS_ASSIGN_OR_RETURN(const ItemSlot slot, OwnedSlot(matrix, expert));
  if (!stacks_->has_momentum(slot)) {
    return FieldError(
        absl::StatusCode::kNotFound, "matrix",
        absl::StrCat(Quoted(matrix), " expert ", expert,
                     " has no momentum on worker ", Quoted(worker_id_)));
  }
  std::vector<float> out(stacks_->stacks[slot.batch].floats());
  MUONPS_RETURN_IF_ERROR(ops_->Copy(out.data(), stacks_->SlotData(slot),
                                    static_cast<int64_t>(out.size()),
                                    ops_->stream()));
  MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
  return out;
}

absl::StatusOr<CheckedMomentum> MomentumStore::Check(
    const std::string& matrix, int64_t expert,
    std::vector<float> values) const {
  CheckedMomentum out;
  int64_t floats = 0;
  {
    absl::MutexLock lock(&mu_);
    MUONPS_ASSIGN_OR_RETURN(const ItemSlot slot, OwnedSlot(matrix, expert));
    floats = stacks_->stacks[slot.batch].floats();
    out.version = stacks_->version;
  }
  if (static_cast<int64_t>(values.size()) != floats) {
    return InvalidField(
        "values",
        absl::StrCat(values.size(), " floats; the matrix has ", floats));
  }
  for (float v : values) {
    if (!std::isfinite(v)) return InvalidField("values", "non-finite");
  }
  out.experts.push_back({matrix, expert, std::move(values)});
  return out;
}

absl::StatusOr<int64_t> MomentumStore::Write(CheckedMomentum checked,
                                             int64_t last_committed) {
  absl::MutexLock lock(&mu_);
  MomentumStacks& now = *stacks_;
  // A checkpoint's restore covers every expert owned in the version it
  // was read for.
  if (checked.checkpoint_step >= 0 && checked.version != now.version) {
    return FieldError(
        absl::StatusCode::kFailedPrecondition, "plan",
        absl::StrCat("plan version ", now.version, " replaced version ",
                     checked.version,
                     " while the checkpoint was read: restore it again"));
  }
  std::vector<ItemSlot> slots;
  for (const CheckedMomentum::Expert& x : checked.experts) {
    MUONPS_ASSIGN_OR_RETURN(const ItemSlot slot, OwnedSlot(x.matrix, x.expert));
    const int64_t floats = now.stacks[slot.batch].floats();
    if (static_cast<int64_t>(x.values.size()) != floats) {
      return InvalidField(
          "values",
          absl::StrCat(x.values.size(), " floats; the matrix has ", floats));
    }
    slots.push_back(slot);
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    const std::vector<float>& values = checked.experts[i].values;
    MUONPS_RETURN_IF_ERROR(ops_->Copy(now.SlotData(slots[i]), values.data(),
                                      static_cast<int64_t>(values.size()),
                                      ops_->stream()));
  }
  MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
  for (const ItemSlot& slot : slots) {
    now.stacks[slot.batch].has_momentum[slot.slot] = true;
  }
  now.DropNext();
  const int64_t written = static_cast<int64_t>(slots.size());
  if (checked.checkpoint_step < 0) {
    for (const CheckedMomentum::Expert& x : checked.experts) {
      lost_items_.erase(
          std::remove(lost_items_.begin(), lost_items_.end(),
                      std::make_pair(now.MatrixIndex(x.matrix), x.expert)),
          lost_items_.end());
    }
    return written;
  }
  const int64_t step = checked.checkpoint_step;
  item_restores_.clear();  // the slots hold this restore's step now
  restored_step_.store(step);
  if (last_committed < 0) restore_unverified_ = step;
  CountRestores(written, 0, 0);
  spdlog::info(
      "worker={} plan_version={} momentum of {} owned experts restored from "
      "the checkpoint of step {} in {}",
      worker_id_, now.version, written, step, checked.checkpoint_dir);
  return written;
}

absl::Status MomentumStore::handover_failed() const {
  absl::MutexLock lock(&mu_);
  return handover_failed_;
}

int64_t MomentumStore::TakeResets() {
  absl::MutexLock lock(&mu_);
  return std::exchange(resets_, 0);
}

}  // namespace worker
}  // namespace muonps
