// MomentumStore: its versions (Prepare, Install and what moves between
// them), the staged step's swap, one expert's reads and writes, the
// checkpoints (snapshots copied under the lock and written outside it by
// MomentumCheckpoints, the checkpoint RPC, the restores) and the handover on
// a new transport of the installed version (momentum_handover.h runs the
// messages) with its bookkeeping of lost and reset items.
#include "server/worker/momentum_store.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "server/worker/checkpoint_store.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// A step's AdamW means sit in its checkpoint as 1 x n tensors under this
// prefix and their tensor's name, beside the momentum of job matrices.
constexpr absl::string_view kMeanPrefix = "muonps.adamw_mean:";

}  // namespace

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

absl::StatusOr<int64_t> MomentumStore::Write(CheckedMomentum checked) {
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
  // From a checkpoint: as of its step; from a caller: the trainer's own
  // saved state, valid for whatever step it asks next.
  for (const ItemSlot& slot : slots) {
    now.stacks[slot.batch].has_momentum[slot.slot] = true;
    now.stacks[slot.batch].as_of[slot.slot] =
        checked.checkpoint_step >= 0 ? checked.checkpoint_step : kAsOfAny;
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
  checkpoints_.Installed(checked, written);
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

std::vector<MomentumCheckpoints::Expert> MomentumStore::Owned(
    bool missing_only) const {
  std::vector<MomentumCheckpoints::Expert> out;
  const MomentumStacks& now = *stacks_;
  for (size_t m = 0; m < now.matrices.size(); ++m) {
    for (int64_t e = 0; e < now.matrices[m].experts; ++e) {
      const ItemSlot slot = now.slot(m, e);
      if (slot.batch < 0 || (missing_only && now.has_momentum(slot))) continue;
      out.push_back({static_cast<int>(m), e, now.matrices[m]});
    }
  }
  return out;
}

absl::StatusOr<int64_t> MomentumStore::RequestCheckpoint() {
  absl::MutexLock lock(&mu_);
  return checkpoints_.Request(stacks_->checkpoint_dir);
}

bool MomentumStore::CheckpointDue(int64_t step) const {
  absl::MutexLock lock(&mu_);
  const MomentumStacks& now = *stacks_;
  return checkpoints_.Due(now.checkpoint_dir, now.checkpoint_every, step,
                          now.version);
}

bool MomentumStore::SurvivesAKill(int64_t step) const {
  {
    absl::MutexLock lock(&mu_);
    if (stacks_->allow_momentum_reset) return true;
  }
  return step >= 0 && (checkpoints_.last_written() == step ||
                       checkpoints_.restored_step() == step);
}

absl::Status MomentumStore::PersistStaged(
    int64_t step, const std::function<absl::StatusOr<StagedMeans>()>& means) {
  CheckpointSnapshot snapshot;
  {
    absl::MutexLock lock(&mu_);
    const MomentumStacks& now = *stacks_;
    if (!checkpoints_.Due(now.checkpoint_dir, now.checkpoint_every, step,
                          now.version)) {
      return absl::OkStatus();
    }
    const std::string what = absl::StrCat("worker ", Quoted(worker_id_),
                                          ": step ", step, "'s checkpoint");
    absl::StatusOr<std::vector<SnapshotTensor>> tensors =
        now.OwnedToHost(*ops_, MomentumStacks::Which::kStaged);
    if (!tensors.ok()) return Annotate(tensors.status(), what);
    if (means) {
      absl::StatusOr<StagedMeans> staged = means();
      if (!staged.ok()) return Annotate(staged.status(), what);
      for (auto& [name, values] : *staged) {
        SnapshotTensor t;
        t.name = absl::StrCat(kMeanPrefix, name);
        t.rows = 1;
        t.cols = static_cast<int64_t>(values.size());
        t.values = std::move(values);
        tensors->push_back(std::move(t));
      }
    }
    snapshot = {now.checkpoint_dir, step, now.version, std::move(*tensors)};
  }
  return Annotate(
      checkpoints_.Write(std::move(snapshot)),
      absl::StrCat("worker ", Quoted(worker_id_), ": step ", step,
                   " is due for a checkpoint and cannot commit before it is "
                   "on disk"));
}

absl::StatusOr<MomentumStore::StagedMeans> MomentumStore::ReadStagedMeans(
    int64_t step) const {
  std::string dir;
  {
    absl::MutexLock lock(&mu_);
    dir = stacks_->checkpoint_dir;
  }
  if (!checkpoints_.enabled() || dir.empty()) {
    return absl::NotFoundError("the job keeps no checkpoints");
  }
  MUONPS_ASSIGN_OR_RETURN(const LoadedCheckpoint loaded,
                          LoadCheckpoint(dir + "/" + worker_id_, step));
  StagedMeans out;
  for (size_t t = 0; t < loaded.manifest.tensors.size(); ++t) {
    const std::string& name = loaded.manifest.tensors[t].name;
    if (absl::StartsWith(name, kMeanPrefix)) {
      out[name.substr(kMeanPrefix.size())] = loaded.tensors[t];
    }
  }
  return out;
}

absl::StatusOr<int64_t> MomentumStore::PersistHeld(int64_t step) {
  CheckpointSnapshot snapshot;
  {
    absl::MutexLock lock(&mu_);
    const MomentumStacks& now = *stacks_;
    if (!checkpoints_.enabled() || now.checkpoint_dir.empty()) {
      return FieldError(absl::StatusCode::kFailedPrecondition,
                        "job.checkpoint_dir",
                        "the job keeps no checkpoints to persist into");
    }
    const auto current = [step](int64_t as_of) {
      return as_of == step || as_of == kAsOfAny;
    };
    const auto add = [&](int matrix, int64_t expert,
                         const float* data) -> absl::Status {
      const scheduler::MatrixSpec& spec = now.matrices[matrix];
      SnapshotTensor t;
      t.name = spec.name;
      t.expert = static_cast<int32_t>(expert);
      t.rows = spec.rows;
      t.cols = spec.cols;
      t.values.resize(t.rows * t.cols);
      MUONPS_RETURN_IF_ERROR(ops_->Copy(t.values.data(), data,
                                        static_cast<int64_t>(t.values.size()),
                                        ops_->stream()));
      snapshot.tensors.push_back(std::move(t));
      return absl::OkStatus();
    };
    for (size_t m = 0; m < now.matrices.size(); ++m) {
      for (int64_t e = 0; e < now.matrices[m].experts; ++e) {
        const ItemSlot s = now.slot(m, e);
        if (s.batch < 0 || !now.has_momentum(s) ||
            !current(now.stacks[s.batch].as_of[s.slot])) {
          continue;
        }
        MUONPS_RETURN_IF_ERROR(add(static_cast<int>(m), e, now.SlotData(s)));
      }
    }
    for (size_t i = 0; i < previous_.held.size(); ++i) {
      const HeldItem& item = previous_.held[i];
      if (item.has_momentum != HeldItem::kHasMomentum ||
          previous_.outgoing_at[i] < 0 || !current(item.as_of) ||
          now.slot(item.matrix, item.expert).batch >= 0) {
        continue;
      }
      MUONPS_RETURN_IF_ERROR(
          add(item.matrix, item.expert,
              previous_.outgoing->data() + previous_.outgoing_at[i]));
    }
    MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
    snapshot.checkpoint_dir = now.checkpoint_dir;
    snapshot.step = step;
    snapshot.plan_version = now.version;
  }
  const int64_t items = static_cast<int64_t>(snapshot.tensors.size());
  if (items == 0) return 0;
  MUONPS_RETURN_IF_ERROR(
      Annotate(checkpoints_.Write(std::move(snapshot)),
               absl::StrCat("worker ", Quoted(worker_id_),
                            ": the momentum it holds as of step ", step)));
  return items;
}

absl::Status MomentumStore::RestoreMissing(int64_t committed) {
  std::vector<MomentumCheckpoints::Expert> missing;
  std::string dir;
  int64_t version = -1;
  {
    absl::MutexLock lock(&mu_);
    dir = stacks_->checkpoint_dir;
    version = stacks_->version;
    if (!checkpoints_.enabled() || dir.empty() || stacks_->rank < 0) {
      return absl::OkStatus();
    }
    missing = Owned(/*missing_only=*/true);
  }
  if (missing.empty()) return absl::OkStatus();
  int64_t reference = -1;
  MUONPS_ASSIGN_OR_RETURN(
      std::vector<MomentumCheckpoints::Found> found,
      checkpoints_.FindMissing(dir, version, std::move(missing), committed,
                               &reference));
  int64_t restored = 0;
  for (const MomentumCheckpoints::Found& x : found) {
    absl::MutexLock lock(&mu_);
    if (stacks_->version != version) break;  // replaced meanwhile
    const ItemSlot slot = stacks_->slot(x.expert.matrix, x.expert.expert);
    MomentumStack& stack = stacks_->stacks[slot.batch];
    const int64_t size = static_cast<int64_t>(x.values.size());
    MUONPS_RETURN_IF_ERROR(
        ops_->Copy(stack.at(slot.slot), x.values.data(), size, ops_->stream()));
    // A step staged in doubt commits its next_momentum: it gets the
    // restored momentum too where it had none for this slot.
    if (stack.next_valid && !stack.next_has_momentum[slot.slot]) {
      MUONPS_RETURN_IF_ERROR(ops_->Copy(stack.next_at(slot.slot),
                                        x.values.data(), size, ops_->stream()));
      stack.next_has_momentum[slot.slot] = true;
      stack.next_as_of[slot.slot] = reference;
    }
    MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
    stack.has_momentum[slot.slot] = true;
    stack.as_of[slot.slot] = reference;
    ++restored;
  }
  checkpoints_.RestoredMissing(dir, version, reference, committed, restored);
  return absl::OkStatus();
}

void MomentumStore::CheckMomentumStep(int64_t step_id) {
  // Slot s of `stack` holds momentum of another step than step_id - 1.
  auto stale_slot = [step_id](const MomentumStack& stack, size_t s) {
    return stack.has_momentum[s] && stack.as_of[s] != kAsOfAny &&
           stack.as_of[s] != step_id - 1;
  };
  std::string dir;
  int64_t stale = 0, oldest = -1;
  {
    absl::MutexLock lock(&mu_);
    dir = stacks_->checkpoint_dir;
    for (const MomentumStack& stack : stacks_->stacks) {
      for (size_t s = 0; s < stack.as_of.size(); ++s) {
        if (!stale_slot(stack, s)) continue;
        ++stale;
        if (oldest < 0 || stack.as_of[s] < oldest) oldest = stack.as_of[s];
      }
    }
  }
  if (stale == 0) return;
  // The job is at step_id - 1: its checkpoint, when the job keeps one,
  // holds every owned expert as of that step (each owner persists a step
  // before its vote).
  if (checkpoints_.enabled() && !dir.empty() && step_id >= 1) {
    absl::StatusOr<CheckedMomentum> checked = ReadCheckpoint(dir, step_id - 1);
    absl::StatusOr<int64_t> written =
        checked.ok() ? Write(*std::move(checked))
                     : absl::StatusOr<int64_t>(checked.status());
    if (written.ok()) {
      spdlog::warn(
          "worker={} {} owned experts held momentum as of step {} (handed "
          "over or restored), but the step staged here is {}: {} read again "
          "from the checkpoint of step {}",
          worker_id_, stale, oldest, step_id, *written, step_id - 1);
      return;
    }
    spdlog::warn(
        "worker={} no checkpoint of step {} for every owned expert: {}",
        worker_id_, step_id - 1, written.status().ToString());
  }
  absl::MutexLock lock(&mu_);
  // Zero, as a new owner with nothing to restore starts (the step reads
  // the buffer, not has_momentum).
  int64_t dropped = 0;
  absl::Status zeroed;
  for (MomentumStack& stack : stacks_->stacks) {
    for (size_t s = 0; s < stack.as_of.size(); ++s) {
      if (!stale_slot(stack, s)) continue;
      ++dropped;
      stack.has_momentum[s] = false;
      stack.as_of[s] = kAsOfAny;
      if (zeroed.ok()) {
        zeroed = ops_->Scale(stack.at(static_cast<int>(s)), stack.floats(),
                             0.0f, ops_->stream());
      }
    }
  }
  if (zeroed.ok()) zeroed = ops_->Synchronize(ops_->stream());
  if (!zeroed.ok()) {
    spdlog::error("worker={} zeroing momentum as of step {} failed: {}",
                  worker_id_, oldest, zeroed.ToString());
  }
  resets_ += dropped;
  resets_total_ += dropped;
  checkpoints_.Dropped(dropped);
  spdlog::error(
      "worker={} plan_version={} momentum of {} owned experts holds step {} "
      "at the oldest (handed over by a worker that missed a step, or "
      "restored), but the step staged here is {}, and no checkpoint holds "
      "step {}: they start from zero instead",
      worker_id_, stacks_->version, dropped, oldest, step_id, step_id - 1);
}

absl::StatusOr<CheckedMomentum> MomentumStore::ReadCheckpoint(
    const std::string& dir, int64_t step) const {
  std::vector<MomentumCheckpoints::Expert> owned;
  int64_t version = -1;
  {
    absl::MutexLock lock(&mu_);
    if (stacks_->rank < 0 && !dir.empty() && dir[0] == '/' && step >= 0) {
      return NoPlan();
    }
    version = stacks_->version;
    owned = Owned(/*missing_only=*/false);
  }
  return checkpoints_.Read(dir, step, version, owned);
}

absl::Status MomentumStore::HandOver(transport::Transport& transport,
                                     kernels::FloatBuffer* control,
                                     int64_t last_committed,
                                     absl::Duration timeout,
                                     bool* transport_ok) {
  HandoverContext context;
  {
    // Both stay in place until the next Install (the device rule).
    absl::MutexLock lock(&mu_);
    context.stacks = stacks_.get();
    context.previous = &previous_;
    context.first = handed_over_version_ != stacks_->version;
  }
  context.control = control;
  context.transport = &transport;
  context.ops = ops_;
  context.last_step = last_committed;
  context.timeout = timeout;
  std::vector<std::pair<int, int64_t>> unresolved;
  context.unresolved = &unresolved;
  // The job's checkpoints, read once, when the first lost item asks.
  std::optional<absl::StatusOr<CheckpointCatalog>> catalog;
  context.checkpoint = [&](int matrix, int64_t expert, float* slot,
                           int64_t step) {
    return MomentumFromCheckpoint(catalog, matrix, expert, slot, step,
                                  last_committed);
  };
  HandoverOutcome outcome;
  const absl::Status status = HandOverMomentum(context, &outcome);
  *transport_ok = outcome.transport_ok;
  if ((!status.ok() && !outcome.transport_ok) || !context.first) {
    return status;
  }
  const int64_t version = context.stacks->version;
  absl::MutexLock lock(&mu_);
  handed_over_version_ = version;
  if (!status.ok()) {
    handover_failed_ = status;
    lost_items_ = std::move(unresolved);
    spdlog::error("worker={} plan_version={} momentum handover: {}", worker_id_,
                  version, status.ToString());
    return status;
  }
  resets_ += outcome.reset;
  resets_total_ += outcome.reset;
  if (outcome.lost > 0) {
    spdlog::warn(
        "worker={} plan_version={} momentum handover: {} matrices lost their "
        "previous owner; here {} restored from the checkpoint, {} start from "
        "zero (allow_momentum_reset)",
        worker_id_, version, outcome.lost, outcome.restored, outcome.reset);
  }
  if (outcome.sent > 0 || outcome.received > 0) {
    spdlog::info(
        "worker={} plan_version={} momentum handover: sent {}, received {} "
        "matrices",
        worker_id_, version, outcome.sent, outcome.received);
  }
  return absl::OkStatus();
}

absl::Status MomentumStore::MomentumFromCheckpoint(
    std::optional<absl::StatusOr<CheckpointCatalog>>& catalog, int matrix,
    int64_t expert, float* slot, int64_t step, int64_t last_committed) {
  std::string dir;
  MomentumCheckpoints::Expert lost;
  bool has_momentum = false;
  int64_t version = -1;
  {
    absl::MutexLock lock(&mu_);
    dir = stacks_->checkpoint_dir;
    lost = {matrix, expert, stacks_->matrices[matrix]};
    has_momentum = stacks_->has_momentum(stacks_->slot(matrix, expert));
    version = stacks_->version;
  }
  MUONPS_ASSIGN_OR_RETURN(
      const std::optional<std::vector<float>> values,
      checkpoints_.ForHandover(catalog, dir, lost, step, last_committed,
                               has_momentum));
  if (!values.has_value()) return absl::OkStatus();  // in the slot already
  // `slot` is the handover's to write (the device rule).
  MUONPS_RETURN_IF_ERROR(ops_->Copy(slot, values->data(),
                                    static_cast<int64_t>(values->size()),
                                    ops_->stream()));
  MUONPS_RETURN_IF_ERROR(ops_->Synchronize(ops_->stream()));
  checkpoints_.HandedOverFromCheckpoint(lost, step, version);
  return absl::OkStatus();
}

}  // namespace worker
}  // namespace muonps
