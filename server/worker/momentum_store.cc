// MomentumStore's versions (Prepare, Install and what moves between them),
// the staged step's swap, and one expert's reads and writes. Checkpoints
// are in momentum_store_checkpoint.cc, the handover in
// momentum_store_handover.cc.
#include "server/worker/momentum_store.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

MomentumStore::MomentumStore(std::string worker_id, kernels::DeviceOps* ops)
    : worker_id_(std::move(worker_id)),
      ops_(ops),
      stacks_(std::make_unique<MomentumStacks>()),
      checkpoints_(worker_id_) {}

absl::StatusOr<PreparedMomentum> MomentumStore::Prepare(
    MomentumStacks layout) const {
  PreparedMomentum next;
  next.stacks = std::move(layout);
  MUONPS_RETURN_IF_ERROR(next.stacks.Allocate(*ops_));
  int64_t room = 0;
  {
    absl::MutexLock lock(&mu_);
    next.installs = installs_;
    const MomentumStacks& now = *stacks_;
    if (next.stacks.version != now.version && next.stacks.SameJob(now)) {
      room = HandoverRoom(now, previous_, next.stacks);
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
        previous,
        KeepForHandover(now, previous_, handed_over_version_ == now.version,
                        lost_items_, next.stacks, std::move(next.outgoing),
                        *ops_));
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
  checkpoints_.Installed(checked, written, last_committed);
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
