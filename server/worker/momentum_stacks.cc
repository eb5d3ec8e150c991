#include "server/worker/momentum_stacks.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace muonps {
namespace worker {

absl::Status MomentumStacks::Allocate(kernels::DeviceOps& ops) {
  slots.assign(matrices.size(), {});
  for (size_t m = 0; m < matrices.size(); ++m) {
    slots[m].assign(matrices[m].experts, ItemSlot{});
  }
  for (size_t b = 0; b < stacks.size(); ++b) {
    MomentumStack& stack = stacks[b];
    for (size_t s = 0; s < stack.items.size(); ++s) {
      const scheduler::ItemRef& item = stack.items[s];
      if (item.matrix < 0 || item.matrix >= static_cast<int>(slots.size()) ||
          item.expert < 0 ||
          item.expert >= static_cast<int>(slots[item.matrix].size())) {
        return InvalidField("stacks",
                            absl::StrCat("item ", item.matrix, "/", item.expert,
                                         " is not in the job"));
      }
      slots[item.matrix][item.expert] = {static_cast<int>(b),
                                         static_cast<int>(s)};
    }
    const int64_t floats =
        static_cast<int64_t>(stack.items.size()) * stack.floats();
    MUONPS_ASSIGN_OR_RETURN(stack.momentum, ops.Allocate(floats, "momentum"));
    MUONPS_ASSIGN_OR_RETURN(stack.next_momentum,
                            ops.Allocate(floats, "staged momentum"));
    stack.has_momentum.assign(stack.items.size(), false);
    stack.next_has_momentum.assign(stack.items.size(), false);
    stack.as_of.assign(stack.items.size(), kAsOfAny);
    stack.next_as_of.assign(stack.items.size(), kAsOfAny);
    stack.next_valid = false;
  }
  return absl::OkStatus();
}

ItemSlot MomentumStacks::slot(int64_t matrix, int64_t expert) const {
  if (matrix < 0 || matrix >= static_cast<int64_t>(slots.size()) ||
      expert < 0 || expert >= static_cast<int64_t>(slots[matrix].size())) {
    return ItemSlot{};
  }
  return slots[matrix][expert];
}

int MomentumStacks::MatrixIndex(const std::string& name) const {
  for (size_t m = 0; m < matrices.size(); ++m) {
    if (matrices[m].name == name) return static_cast<int>(m);
  }
  return -1;
}

bool MomentumStacks::SameJob(const MomentumStacks& other) const {
  if (matrices.size() != other.matrices.size()) return false;
  for (size_t m = 0; m < matrices.size(); ++m) {
    const scheduler::MatrixSpec &a = matrices[m], &b = other.matrices[m];
    if (a.name != b.name || a.rows != b.rows || a.cols != b.cols) return false;
  }
  return true;
}

absl::Status MomentumStacks::CarryFrom(const MomentumStacks& old,
                                       bool carry_staged,
                                       kernels::DeviceOps& ops) {
  for (MomentumStack& stack : stacks) stack.next_valid = carry_staged;
  if (!SameJob(old)) return absl::OkStatus();
  for (size_t m = 0; m < matrices.size(); ++m) {
    for (int64_t e = 0; e < matrices[m].experts; ++e) {
      const ItemSlot to = slot(m, e);
      const ItemSlot from = old.slot(m, e);
      if (to.batch < 0 || from.batch < 0) continue;
      const MomentumStack& was = old.stacks[from.batch];
      const bool staged =
          carry_staged && was.next_valid && was.next_has_momentum[from.slot];
      // Moved here: the handover brings it (momentum_handover.h).
      if (!was.has_momentum[from.slot] && !staged) continue;
      MomentumStack& now = stacks[to.batch];
      const int64_t size = now.floats();
      MUONPS_RETURN_IF_ERROR(
          ops.Copy(now.at(to.slot), was.at(from.slot), size, ops.stream()));
      now.has_momentum[to.slot] = was.has_momentum[from.slot];
      now.as_of[to.slot] = was.as_of[from.slot];
      if (!carry_staged) continue;
      MUONPS_RETURN_IF_ERROR(
          ops.Copy(now.next_at(to.slot),
                   was.next_valid ? was.next_at(from.slot) : was.at(from.slot),
                   size, ops.stream()));
      now.next_has_momentum[to.slot] = was.next_valid
                                           ? was.next_has_momentum[from.slot]
                                           : was.has_momentum[from.slot];
      now.next_as_of[to.slot] =
          was.next_valid ? was.next_as_of[from.slot] : was.as_of[from.slot];
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SnapshotTensor>> MomentumStacks::OwnedToHost(
    kernels::DeviceOps& ops, Which which) const {
  const bool staged = which == Which::kStaged;
  std::vector<SnapshotTensor> out;
  for (size_t m = 0; m < matrices.size(); ++m) {
    for (int64_t e = 0; e < matrices[m].experts; ++e) {
      const ItemSlot s = slot(m, e);
      if (s.batch < 0) continue;
      const MomentumStack& stack = stacks[s.batch];
      if (staged && !stack.next_valid) {
        return absl::FailedPreconditionError(absl::StrCat(
            "matrix ", Quoted(matrices[m].name), " holds no staged step"));
      }
      const bool holds =
          staged ? stack.next_has_momentum[s.slot] : has_momentum(s);
      if (!holds) continue;
      SnapshotTensor t;
      t.name = matrices[m].name;
      t.expert = static_cast<int32_t>(e);
      t.rows = matrices[m].rows;
      t.cols = matrices[m].cols;
      t.values.resize(t.rows * t.cols);
      MUONPS_RETURN_IF_ERROR(ops.Copy(
          t.values.data(), staged ? stack.next_at(s.slot) : SlotData(s),
          static_cast<int64_t>(t.values.size()), ops.stream()));
      out.push_back(std::move(t));
    }
  }
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(ops.stream()));
  return out;
}

void MomentumStacks::CommitNext() {
  for (MomentumStack& stack : stacks) {
    if (!stack.next_valid) continue;
    std::swap(stack.momentum, stack.next_momentum);
    stack.has_momentum = stack.next_has_momentum;
    stack.as_of = stack.next_as_of;
    stack.next_valid = false;
  }
}

void MomentumStacks::DropNext() {
  for (MomentumStack& stack : stacks) stack.next_valid = false;
}

}  // namespace worker
}  // namespace muonps
