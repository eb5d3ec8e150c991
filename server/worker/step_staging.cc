#include "server/worker/step_staging.h"

#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/row_ranges.h"
#include "common/status.h"
#include "server/worker/row_relay.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// Gradients and means move as fp32; updates in the plan's update_dtype.
constexpr DType kF32 = DType::kFloat32;

}  // namespace

absl::Status WidenGradient(const Binding& b, kernels::DeviceOps& ops,
                           Stream stream) {
  if (b.dtype == DType::kFloat32) return absl::OkStatus();
  return ops.ToFloat(b.grad, b.lent_grad, b.dtype, b.elements, stream);
}

StepStaging::StepStaging(PlanState& plan, const AttachedTrainer* trainer,
                         transport::Transport& transport,
                         kernels::DeviceOps& ops, kernels::MuonKernels& kernels,
                         StepLedger& ledger, const StepRoster& roster,
                         StepTimeline& timeline, const StepHook& hook,
                         absl::Duration timeout)
    : plan_(plan),
      trainer_(trainer),
      t_(transport),
      ops_(ops),
      kernels_(kernels),
      ledger_(ledger),
      roster_(roster),
      timeline_(timeline),
      hook_(hook),
      timeout_(timeout),
      stream_(ops.stream()),
      compute_(ops.compute_stream()),
      trainers_(plan.trainers()),
      momentum_(plan.momentum->installed()),
      ready_(trainer == nullptr ? 0 : trainer->matrices.size(), false) {}

absl::Status StepStaging::ReadyGradients(absl::Span<const int32_t> matrices,
                                         bool* enqueued) {
  if (trainer_ == nullptr) return absl::OkStatus();
  for (const int32_t m : matrices) {
    if (ready_[m]) continue;
    const Binding& b = trainer_->matrices[m];
    // The step's own event orders every gradient that has none of its own:
    // waited for once.
    if (b.ready >= 0 || !waited_trainer_) {
      MUONPS_RETURN_IF_ERROR(
          trainer_->buffers->WaitForGradient(b.ready, stream_));
      if (b.ready < 0) waited_trainer_ = true;
    }
    MUONPS_RETURN_IF_ERROR(WidenGradient(b, ops_, stream_));
    MUONPS_RETURN_IF_ERROR(check_->Matrix(m));
    ready_[m] = true;
    *enqueued = true;
  }
  return absl::OkStatus();
}

absl::Status StepStaging::PrepareCheck() {
  if (trainer_ == nullptr || check_.has_value()) return absl::OkStatus();
  check_.emplace(plan_, *trainer_, ops_, stream_);
  return check_->Prepare();
}

absl::Status StepStaging::GradientsFinite() {
  return check_.has_value() ? check_->Result() : absl::OkStatus();
}

absl::Status StepStaging::ReadyEveryGradient() {
  if (trainer_ == nullptr || every_ready_) return absl::OkStatus();
  every_ready_ = true;
  MUONPS_RETURN_IF_ERROR(trainer_->buffers->WaitForTrainer(stream_));
  waited_trainer_ = true;
  // Every matrix is in a bucket, so none should be left; any that is goes
  // the buckets' way.
  std::vector<int32_t> every(ready_.size());
  std::iota(every.begin(), every.end(), 0);
  bool enqueued = false;
  MUONPS_RETURN_IF_ERROR(ReadyGradients(every, &enqueued));
  for (const auto& [name, b] : trainer_->adamw) {
    MUONPS_RETURN_IF_ERROR(WidenGradient(b, ops_, stream_));
  }
  return check_->AdamW();
}

absl::Status StepStaging::ComputeAhead(int64_t step_id) {
  step_id_ = step_id;
  int first = -1;  // this worker's first stack in the schedule's order
  for (const scheduler::Phase& phase : plan_.schedule.order) {
    if (phase.kind == scheduler::PhaseKind::kCompute &&
        plan_.batch_of_stack[phase.index] >= 0) {
      first = phase.index;
      break;
    }
  }
  if (first < 0 || trainer_ == nullptr) return absl::OkStatus();
  // Ready at the step's first mark: every item's gradient is the trainer's
  // own, read in place (replicated), so nothing has to move first.
  const int batch = plan_.batch_of_stack[first];
  for (const scheduler::ItemRef& item : plan_.batches[batch].items) {
    if (plan_.matrices[item.matrix].layout != scheduler::Layout::kReplicated) {
      return absl::OkStatus();
    }
  }
  ops_.ClearMarks();
  timeline_.ClearMarks();
  MUONPS_ASSIGN_OR_RETURN(begin_mark_, ops_.Mark(stream_));
  timeline_.AddMark("begin", -1, begin_mark_);
  MUONPS_RETURN_IF_ERROR(PrepareCheck());
  std::vector<int32_t> matrices;
  for (const scheduler::ItemRef& item : plan_.batches[batch].items) {
    matrices.push_back(item.matrix);
  }
  bool enqueued = false;
  MUONPS_RETURN_IF_ERROR(ReadyGradients(matrices, &enqueued));
  MUONPS_ASSIGN_OR_RETURN(const int ready, ops_.Mark(stream_));
  MUONPS_RETURN_IF_ERROR(ops_.WaitForMark(compute_, ready));
  MUONPS_ASSIGN_OR_RETURN(const int began, ops_.Mark(compute_));
  timeline_.AddMark("compute_begin", first, began);
  MUONPS_RETURN_IF_ERROR(
      Compute(plan_.batches[batch], momentum_.stacks[batch]));
  MUONPS_ASSIGN_OR_RETURN(ahead_done_mark_, ops_.Mark(compute_));
  timeline_.AddMark("compute", first, ahead_done_mark_);
  ahead_ = true;
  return absl::OkStatus();
}

absl::Status StepStaging::Stage(int64_t step_id, const StepRequest& request) {
  if (ahead_ && step_id != step_id_) {
    return absl::InternalError(
        absl::StrCat("step ", step_id_, " was computed ahead, not ", step_id));
  }
  step_id_ = step_id;
  if (trainer_ == nullptr) MUONPS_RETURN_IF_ERROR(PrepareFollowerBuffers());
  // Every bucket's gradients to owners are issued first, in the
  // schedule's order, each followed by a mark; then the schedule's compute
  // and updates back. A stack waits for the mark of the bucket that
  // completes it, never for updates going back (each stack has its own
  // slot, read from there into the trainer's staging), so no bucket is a
  // barrier among the workers, and gradients keep moving while stacks
  // compute. Every rank issues the same transfers in the same order.
  int begin = begin_mark_;
  if (!ahead_) {
    ops_.ClearMarks();
    timeline_.ClearMarks();
    MUONPS_ASSIGN_OR_RETURN(begin, ops_.Mark(stream_));
    timeline_.AddMark("begin", -1, begin);
  }
  MUONPS_RETURN_IF_ERROR(PrepareCheck());
  // bucket_mark[j]: the mark after the gradients of buckets up to j (in
  // arrival order) moved; a stack ready with j reads nothing later.
  std::vector<int> bucket_mark(plan_.schedule.buckets.size(), begin);
  int moved = begin;
  bool first = true;
  // Unreduced gradients summed in two levels: each bucket's exchange joins
  // the pipeline after its other transfers, and its mark waits for the
  // exchange's last launch (`unsummed`: the buckets whose mark does, in
  // order; `summing`: those whose exchange is in flight).
  std::optional<ExchangePipeline> sums;
  if (scheduler::SumsOverNodes(plan_.schedule.exchange_nodes, plan_.matrices)) {
    sums.emplace(plan_.schedule.exchange_nodes, plan_.rank, t_, ops_,
                 plan_.exchange, stream_, ExchangePipeline::Way::kSum);
  }
  std::deque<int> unsummed;
  std::vector<bool> summing(plan_.schedule.buckets.size(), false);
  const auto settle = [&](int mark) {
    for (const int done : sums->TakeDone()) summing[done] = false;
    while (!unsummed.empty() && !summing[unsummed.front()]) {
      bucket_mark[unsummed.front()] = mark;
      unsummed.pop_front();
    }
  };
  for (const scheduler::Phase& phase : plan_.schedule.order) {
    if (phase.kind != scheduler::PhaseKind::kToOwners) continue;
    const scheduler::Bucket& bucket = plan_.schedule.buckets[phase.index];
    // The bucket's gradients as backward finishes them (the trainer's
    // events for them), so its transfers and stacks start during backward.
    bool readied = false;
    MUONPS_RETURN_IF_ERROR(ReadyGradients(bucket.matrices, &readied));
    std::vector<ExchangeItem> exchanged;
    MUONPS_RETURN_IF_ERROR(ToOwners(bucket, &exchanged));
    summing[phase.index] = !exchanged.empty();
    if (sums) {
      MUONPS_RETURN_IF_ERROR(
          sums->Push(phase.index, std::move(exchanged), &bytes_));
    }
    if (first && hook_) {
      hook_(StepPoint::kTransfer, step_id_, plan_.rank);
    }
    first = false;
    if (readied || !bucket.to_owners.empty() || sums) {
      MUONPS_ASSIGN_OR_RETURN(moved, ops_.Mark(stream_));
    }
    if (!bucket.to_owners.empty()) {
      timeline_.AddMark("to_owners", phase.index, moved);
    }
    if (!sums) {
      bucket_mark[phase.index] = moved;
      continue;
    }
    unsummed.push_back(phase.index);
    settle(moved);
  }
  if (sums) {
    MUONPS_RETURN_IF_ERROR(sums->Drain(&bytes_));
    MUONPS_ASSIGN_OR_RETURN(moved, ops_.Mark(stream_));
    timeline_.AddMark("summed", -1, moved);
    settle(moved);
  }
  if (early_ == EarlyApply::kDecided && trainer_ != nullptr) {
    // Decided once every gradient is checked, before any update lands.
    MUONPS_RETURN_IF_ERROR(ReadyEveryGradient());
    if (check_->Result().ok()) {
      ledger_.staged.early = EarlyApply::kDecided;
      // As the commit records them: decided, then being applied.
      for (const StepRecordWord word :
           {StepRecordWord::kDecided, StepRecordWord::kApplying}) {
        MUONPS_RETURN_IF_ERROR(trainer_->buffers->WriteRecord(
            stream_, word, StepRecordValue(step_id_)));
      }
      if (hook_) hook_(StepPoint::kDecided, step_id_, plan_.rank);
    }
  } else if (early_ == EarlyApply::kUndoable && trainer_ != nullptr) {
    ledger_.staged.early = EarlyApply::kUndoable;
  }
  // This worker's stacks, in the schedule's order.
  std::vector<int> own;
  for (const scheduler::Phase& phase : plan_.schedule.order) {
    if (phase.kind == scheduler::PhaseKind::kCompute &&
        plan_.batch_of_stack[phase.index] >= 0) {
      own.push_back(phase.index);
    }
  }
  std::vector<int> done_mark(own.size(), -1);
  size_t issued = 0;   // own stacks issued on compute_
  size_t reached = 0;  // own stacks the walk of the order has passed
  size_t ordered = 0;  // own stacks stream_ waits for
  int waited = -1;     // the last mark compute_ waits for
  if (ahead_) {        // the first one is (ComputeAhead)
    done_mark[0] = ahead_done_mark_;
    issued = 1;
    waited = begin;
  }
  // The staged applies not enqueued yet, once the step has them in its
  // staging: those this worker's stream orders after `landing` (a mark of
  // stream_ that follows their landing), a peer's copies after its landing
  // word for their run. Not before stream_ waited for the trainer's step
  // event: backward may still read a parameter whose gradient it has
  // given. Decided (one worker): on stream_, beside the next stack's
  // Newton-Schulz. Undoable (several): on compute_ once every stack of this
  // worker is issued there, so after its last Newton-Schulz, beside the
  // updates still going back (an apply beside the GEMMs slows them by more
  // than it takes alone: bench/results/2026-12-03-h200x1-apply-beside-
  // gemms.jsonl), what it overwrites kept first; stream_ does not wait
  // for them (StagedStep::applied_mark).
  const auto apply_landed = [&](int landing) -> absl::Status {
    std::vector<ParamApply>& applies = ledger_.staged.applies;
    const EarlyApply how = ledger_.staged.early;
    if (how == EarlyApply::kNone || !waited_trainer_ ||
        (how == EarlyApply::kUndoable && issued < own.size())) {
      return absl::OkStatus();
    }
    std::vector<ParamApply> landed;
    const auto take = [&](size_t i) {
      applies[i].applied = true;
      landed.push_back(applies[i]);
      applied_early_ += applies[i].count;
    };
    // A peer's copies by run, then writer: the order they land in.
    std::map<std::pair<int32_t, int32_t>, std::vector<size_t>> copies;
    for (; scanned_ < applies.size(); ++scanned_) {
      const ParamApply& a = applies[scanned_];
      if (a.writer < 0) {
        take(scanned_);
      } else if (how == EarlyApply::kUndoable && LandingSlot(a) >= 0) {
        copies[{a.run, a.writer}].push_back(scanned_);
      }  // else the commit's, after the votes
    }
    if (how == EarlyApply::kDecided) {
      if (landed.empty()) return absl::OkStatus();
      return ApplyUpdates(landed, *trainer_, ops_, stream_);
    }
    if (landed.empty() && copies.empty()) return absl::OkStatus();
    if (!landed.empty()) {
      MUONPS_RETURN_IF_ERROR(ops_.WaitForMark(compute_, landing));
      MUONPS_RETURN_IF_ERROR(ApplyUndoably(landed));
    }
    const absl::Time deadline = absl::Now() + timeout_;
    for (const auto& [key, indices] : copies) {
      const ParamApply& first = applies[indices[0]];
      const int slot = LandingSlot(first);
      if (std::find(awaited_slots_.begin(), awaited_slots_.end(), slot) ==
          awaited_slots_.end()) {
        awaited_slots_.push_back(slot);
      }
      MUONPS_RETURN_IF_ERROR(plan_.lender->AwaitSignal(
          compute_, trainer_->landing + slot,
          LandingValue(ledger_.round, first.run), deadline));
      landed.clear();
      for (const size_t i : indices) take(i);
      MUONPS_RETURN_IF_ERROR(ApplyUndoably(landed));
    }
    MUONPS_ASSIGN_OR_RETURN(ledger_.staged.applied_mark, ops_.Mark(compute_));
    timeline_.AddMark("applied_early", -1, ledger_.staged.applied_mark);
    return absl::OkStatus();
  };
  const auto issue_next = [&]() -> absl::Status {
    const int stack = own[issued];
    const int needed = bucket_mark[plan_.schedule.stacks[stack].ready_bucket];
    if (needed > waited) {
      MUONPS_RETURN_IF_ERROR(ops_.WaitForMark(compute_, needed));
      waited = needed;
    }
    MUONPS_ASSIGN_OR_RETURN(const int began, ops_.Mark(compute_));
    timeline_.AddMark("compute_begin", stack, began);
    const int batch = plan_.batch_of_stack[stack];
    MUONPS_RETURN_IF_ERROR(
        Compute(plan_.batches[batch], momentum_.stacks[batch]));
    MUONPS_ASSIGN_OR_RETURN(done_mark[issued], ops_.Mark(compute_));
    timeline_.AddMark("compute", stack, done_mark[issued]);
    ++issued;
    return absl::OkStatus();
  };
  // A run of updates-back phases with nothing between them is one NCCL
  // group (one launch, the run's transfers concurrent: the tail after the
  // last stack goes as a single collective, not one per bucket). Their
  // marks follow the group.
  std::vector<int> run;
  const auto end_run = [&]() -> absl::Status {
    if (run.empty()) return absl::OkStatus();
    MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
    MUONPS_RETURN_IF_ERROR(ForwardRelayed());
    MUONPS_RETURN_IF_ERROR(GatherExchanged());
    MUONPS_ASSIGN_OR_RETURN(const int done, ops_.Mark(stream_));
    for (const int bucket : run) timeline_.AddMark("from_owners", bucket, done);
    run.clear();
    landed_ = 0;
    MUONPS_RETURN_IF_ERROR(SignalLanded());
    return apply_landed(done);
  };
  for (const scheduler::Phase& phase : plan_.schedule.order) {
    if (phase.kind != scheduler::PhaseKind::kFromOwners) {
      MUONPS_RETURN_IF_ERROR(end_run());
    }
    switch (phase.kind) {
      case scheduler::PhaseKind::kToOwners:
        break;  // issued above
      case scheduler::PhaseKind::kCompute:
        if (plan_.batch_of_stack[phase.index] < 0) break;  // another's
        ++reached;
        if (issued < reached) MUONPS_RETURN_IF_ERROR(issue_next());
        break;
      case scheduler::PhaseKind::kFromOwners: {
        // The next own stack goes first (one ahead of the order at
        // most), so the compute stream has work while the host enqueues
        // this phase's transfers (NCCL takes ~0.2 ms of host time a
        // phase, and the phases of other workers' stacks may come
        // first). The phase still waits only for the stacks before it.
        if (issued == reached && issued < own.size()) {
          MUONPS_RETURN_IF_ERROR(issue_next());
        }
        // The phase waits for this worker's stacks before it in the order,
        // and for its first stack at least: an NCCL kernel launched before
        // its peer's data is ready spins on SMs the compute needs (a rank
        // whose first phase carried a peer's first stack ran its own first
        // stack 34% slower, 24.3 ms against 18.1 for the same shape on the
        // peer), and a peer's first stack is ready about when this one's
        // is. Enqueued at once, so ahead of the run's transfers (the group
        // launches them at its end).
        const size_t wanted = std::max<size_t>(reached, issued > 0 ? 1 : 0);
        if (wanted > ordered) {
          MUONPS_RETURN_IF_ERROR(
              ops_.WaitForMark(stream_, done_mark[wanted - 1]));
          ordered = wanted;
        }
        if (run.empty()) MUONPS_RETURN_IF_ERROR(t_.GroupStart());
        run.push_back(phase.index);
        MUONPS_RETURN_IF_ERROR(
            FromOwners(plan_.schedule.buckets[phase.index], request));
        break;
      }
    }
  }
  MUONPS_RETURN_IF_ERROR(end_run());
  if (reached > ordered) {
    MUONPS_RETURN_IF_ERROR(ops_.WaitForMark(stream_, done_mark[reached - 1]));
  }
  // The trainer's step event: its AdamW gradients, and what the finite
  // check reads after the stage.
  MUONPS_RETURN_IF_ERROR(ReadyEveryGradient());
  if (ledger_.staged.early != EarlyApply::kNone) {
    // Any left (for the step event, or for this worker's last stack).
    MUONPS_ASSIGN_OR_RETURN(const int now, ops_.Mark(stream_));
    MUONPS_RETURN_IF_ERROR(apply_landed(now));
  }
  MUONPS_RETURN_IF_ERROR(AverageAdamWGradients());
  // Staged when the transport's work and the stream are: a lost peer
  // fails here within the timeout instead of hanging.
  MUONPS_RETURN_IF_ERROR(t_.Synchronize(stream_, timeout_));
  MUONPS_RETURN_IF_ERROR(ops_.Synchronize(stream_));
  timeline_.Staged();
  return absl::OkStatus();
}

absl::Status StepStaging::SignalLanded() {
  const int slot = plan_.windows.LandingSlot(plan_.rank);
  if (slot >= 0 && run_ < kMostLandingRuns) {
    for (const int r : written_to_) {
      MUONPS_RETURN_IF_ERROR(
          plan_.lender->Signal(stream_, plan_.windows.LandingWord(r, slot),
                               LandingValue(ledger_.round, run_)));
    }
  }
  written_to_.clear();
  ++run_;
  return absl::OkStatus();
}

int StepStaging::LandingSlot(const ParamApply& apply) const {
  if (apply.writer < 0 || trainer_ == nullptr || trainer_->landing == nullptr ||
      plan_.lender == nullptr || apply.run >= kMostLandingRuns) {
    return -1;
  }
  return plan_.windows.LandingSlot(apply.writer);
}

absl::Status StepStaging::ApplyUndoably(
    const std::vector<ParamApply>& applies) {
  if (undoable_.empty()) {
    // From here until the commit or the undo, the parameters may hold
    // part of the step: a successor of this worker must not take them as
    // whole.
    MUONPS_RETURN_IF_ERROR(trainer_->buffers->WriteRecord(
        compute_, StepRecordWord::kApplying, StepRecordValue(step_id_)));
  }
  MUONPS_RETURN_IF_ERROR(KeepParameters(applies, *trainer_, ops_, compute_));
  undoable_.insert(undoable_.end(), applies.begin(), applies.end());
  return ApplyUpdates(applies, *trainer_, ops_, compute_);
}

absl::Status StepStaging::UndoEarlyApplies() {
  // The waits for landing words first, in the transfer stream's order
  // ahead of its wait for the compute stream below: a writer that stopped
  // before its word would hold both streams for good.
  for (const int slot : awaited_slots_) {
    MUONPS_RETURN_IF_ERROR(plan_.lender->Signal(
        stream_, trainer_->landing + slot, LandingReleased(ledger_.round)));
  }
  if (!awaited_slots_.empty()) {
    spdlog::info(
        "step {}: released the waits for {} writer(s)' landing words to put "
        "the parameters back",
        step_id_, awaited_slots_.size());
  }
  awaited_slots_.clear();
  if (undoable_.empty()) return absl::OkStatus();
  // In reverse: where two applies wrote one range, the first one's kept
  // values go back last.
  std::vector<ParamApply> back(undoable_.rbegin(), undoable_.rend());
  undoable_.clear();
  applied_early_ = 0;
  // After everything on compute_, the applies included.
  MUONPS_ASSIGN_OR_RETURN(const int applied, ops_.Mark(compute_));
  MUONPS_RETURN_IF_ERROR(ops_.WaitForMark(stream_, applied));
  MUONPS_RETURN_IF_ERROR(RestoreParameters(back, *trainer_, ops_, stream_));
  StagedStep& staged = ledger_.staged;
  if (staged.step_id == step_id_) {  // in doubt: its commit applies all
    for (ParamApply& a : staged.applies) a.applied = false;
    staged.early = EarlyApply::kNone;
    staged.applied_mark = -1;
  }
  return trainer_->buffers->WriteRecord(stream_, StepRecordWord::kApplying,
                                        StepRecordValue(ledger_.params_step()));
}

absl::Status StepStaging::PrepareFollowerBuffers() {
  int64_t largest = 1;
  // What one NCCL group lands here, each call in a place of its own (a
  // group's calls run at once, and a rank in the middle of a broadcast's
  // chain passes on what it received): every mean, or the updates of a run
  // of updates-back phases.
  int64_t sink = 1;
  for (int64_t n : roster_.follower_adamw) {
    largest = std::max(largest, n);
    sink += n;
  }
  for (const scheduler::MatrixSpec& spec : plan_.matrices) {
    largest = std::max(largest, spec.rows * spec.cols);
  }
  // A run of updates-back phases is one group (Stage); its updates are of
  // the plan's update_dtype.
  int64_t updates = 0;
  for (const scheduler::Phase& phase : plan_.schedule.order) {
    if (phase.kind != scheduler::PhaseKind::kFromOwners) {
      updates = 0;
      continue;
    }
    for (const scheduler::Transfer& x :
         plan_.schedule.buckets[phase.index].from_owners) {
      const scheduler::MatrixSpec& spec = plan_.matrices[x.item.matrix];
      updates += spec.rows * spec.cols;
    }
    const int64_t bytes =
        updates * static_cast<int64_t>(DTypeSize(plan_.update_dtype));
    sink = std::max(sink, (bytes + 3) / 4);
  }
  if (plan_.zeros == nullptr || plan_.zeros->size() < largest) {
    // Zero-filled once: the parts this rank adds to every sum.
    MUONPS_ASSIGN_OR_RETURN(plan_.zeros, ops_.Allocate(largest, "zero parts"));
  }
  if (plan_.sink == nullptr || plan_.sink->size() < sink) {
    MUONPS_ASSIGN_OR_RETURN(plan_.sink,
                            ops_.Allocate(sink, "received means and updates"));
  }
  return absl::OkStatus();
}

ExpertPart StepStaging::PartOfExpert(const scheduler::MatrixSpec& spec,
                                     int64_t expert, int trainer) const {
  return ReplicaPartOfExpert(spec.rows, spec.experts, spec.shard_experts,
                             expert, trainer, trainers_, plan_.job.replicas);
}

std::unique_ptr<RowRelay> StepStaging::Relay() {
  return std::make_unique<RowRelay>(
      plan_.schedule.exchange_nodes, plan_.exchange.at, plan_.rank,
      plan_.group_members, roster_.trainer_rank_of,
      [this](const scheduler::MatrixSpec& spec, int64_t expert, int trainer) {
        return PartOfExpert(spec, expert, trainer);
      },
      t_, plan_.relay == nullptr ? nullptr : plan_.relay->data(),
      plan_.relay == nullptr ? 0 : plan_.relay->size() * 4, stream_);
}

bool StepStaging::FullParam(int32_t matrix) const {
  return trainer_ != nullptr ? trainer_->matrices[matrix].full_param
                             : roster_.follower_full_param[matrix] != 0;
}

absl::Status StepStaging::ToOwners(const scheduler::Bucket& bucket,
                                   std::vector<ExchangeItem>* exchanged) {
  const std::unique_ptr<RowRelay> relay = Relay();
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (const scheduler::Transfer& x : bucket.to_owners) {
    if (x.group != plan_.group) continue;  // another owner group's
    const scheduler::MatrixSpec& spec = plan_.matrices[x.item.matrix];
    const Binding* b =
        trainer_ == nullptr ? nullptr : &trainer_->matrices[x.item.matrix];
    const int64_t e = x.item.expert;
    const int64_t size = spec.rows * spec.cols;
    const bool mine = x.owner == plan_.rank;
    float* staged =
        mine ? plan_.StagedData(momentum_.slot(x.item.matrix, e)) : nullptr;
    if (x.kind == scheduler::TransferKind::kExchangeToOwner) {
      ExchangeItem& item = exchanged->emplace_back();
      item.size = size;
      item.owner = x.owner;
      item.part = b == nullptr ? plan_.zeros->data() : b->grad + e * size;
      item.sum = staged;
      continue;
    }
    if (x.kind == scheduler::TransferKind::kReduceToOwner) {
      const float* part =
          b == nullptr ? plan_.zeros->data() : b->grad + e * size;
      MUONPS_RETURN_IF_ERROR(t_.ReduceSum(part, staged, size, x.owner,
                                          roster_.reduce_order, stream_));
      bytes_ += size * 4;
      continue;
    }
    if (x.kind == scheduler::TransferKind::kSendToOwner) {
      // The owner has no trainer: trainer 0's worker sends the gradient.
      const int source = roster_.reduce_order[0];
      if (plan_.rank == source) {
        MUONPS_RETURN_IF_ERROR(
            t_.Send(b->grad + e * size, size, kF32, x.owner, stream_));
        bytes_ += size * 4;
      } else if (mine) {
        MUONPS_RETURN_IF_ERROR(t_.Recv(staged, size, kF32, source, stream_));
      }
      continue;
    }
    // kGatherToOwner: row ranges of every trainer of the owner's group
    // onto the owner (of an expert sharded whole, the one that holds it);
    // across nodes, through relays (row_relay.h).
    if (scheduler::RelaysRows(plan_.schedule.exchange_nodes, spec)) {
      const float* rows = nullptr;
      if (b != nullptr) {
        const ExpertPart part = PartOfExpert(spec, e, trainer_->rank);
        if (part.rows() > 0) {
          rows = b->grad + part.first_row * spec.cols;
          if (mine) {
            MUONPS_RETURN_IF_ERROR(
                ops_.Copy(staged + part.row_begin * spec.cols, rows,
                          part.rows() * spec.cols, stream_));
          }
        }
      }
      MUONPS_RETURN_IF_ERROR(
          relay->Gather(spec, e, x.owner, rows, staged, &bytes_));
      continue;
    }
    if (!mine) {
      if (b == nullptr) continue;  // no trainer, no rows
      const ExpertPart part = PartOfExpert(spec, e, trainer_->rank);
      const int64_t local = part.rows() * spec.cols;
      if (local == 0) continue;
      MUONPS_RETURN_IF_ERROR(t_.Send(b->grad + part.first_row * spec.cols,
                                     local, kF32, x.owner, stream_));
      bytes_ += local * 4;
      continue;
    }
    for (const int r : plan_.group_members) {
      if (roster_.trainer_rank_of[r] < 0) continue;  // no trainer, no rows
      const ExpertPart part = PartOfExpert(spec, e, roster_.trainer_rank_of[r]);
      float* dst = staged + part.row_begin * spec.cols;
      const int64_t count = part.rows() * spec.cols;
      if (count == 0) continue;
      if (r == plan_.rank) {
        MUONPS_RETURN_IF_ERROR(ops_.Copy(
            dst, b->grad + part.first_row * spec.cols, count, stream_));
      } else {
        MUONPS_RETURN_IF_ERROR(t_.Recv(dst, count, kF32, r, stream_));
        bytes_ += count * 4;
      }
    }
  }
  MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
  return relay->Forward(&bytes_);
}

absl::Status StepStaging::Compute(ComputeBatch& batch, MomentumStack& stack) {
  const kernels::MuonHyperparameters& h = plan_.muon;
  const int64_t size = batch.rows * batch.cols;
  const int64_t count = static_cast<int64_t>(batch.items.size());
  const kernels::MatrixStack grad{batch.staged->data(), count, batch.rows,
                                  batch.cols};
  // The new momentum is written beside the old, which stays as it is until
  // the step commits.
  const kernels::MatrixStack old{stack.momentum->data(), count, batch.rows,
                                 batch.cols};
  const kernels::MatrixStack buf{stack.next_momentum->data(), count, batch.rows,
                                 batch.cols};
  for (size_t s = 0; s < batch.items.size(); ++s) {
    const scheduler::ItemRef& item = batch.items[s];
    const scheduler::MatrixSpec& spec = plan_.matrices[item.matrix];
    const kernels::MatrixStack update{grad.matrix(s), 1, batch.rows,
                                      batch.cols};
    const kernels::MatrixStack previous{old.matrix(s), 1, batch.rows,
                                        batch.cols};
    const kernels::MatrixStack momentum{buf.matrix(s), 1, batch.rows,
                                        batch.cols};
    kernels::MatrixStack source = update;  // staged: reduced or gathered
    if (spec.layout == scheduler::Layout::kReplicated && trainer_ != nullptr) {
      // Momentum reads the trainer's gradient in place: no staging copy.
      source.data = trainer_->matrices[item.matrix].grad + item.expert * size;
    } else if (spec.layout == scheduler::Layout::kUnreduced) {
      // The mean, as DDP: the fp32 sum times the fp32 inverse.
      MUONPS_RETURN_IF_ERROR(ops_.Scale(
          update.data, size, 1.0f / static_cast<float>(trainers_), compute_));
    }
    // The update goes to the stack slot (it may alias a staged source).
    MUONPS_RETURN_IF_ERROR(kernels_.UpdateMomentum(
        source, previous, momentum, h.momentum, h.nesterov, update, compute_));
  }
  stack.next_has_momentum.assign(batch.items.size(), true);
  stack.next_as_of.assign(batch.items.size(), step_id_);
  stack.next_valid = true;
  // One call per chunk, each with the algorithm the plan chose for its part
  // (NS is per matrix: the results do not depend on the cut).
  NewtonSchulzOptions ns = h.ns;
  int64_t first = 0;
  for (const scheduler::StackChunk& chunk : batch.chunks) {
    ns.algorithm = chunk.algorithm;
    const kernels::MatrixStack part{grad.matrix(first), chunk.count, batch.rows,
                                    batch.cols};
    MUONPS_RETURN_IF_ERROR(kernels_.Orthogonalize(part, part, ns, compute_));
    first += chunk.count;
  }
  return absl::OkStatus();
}

absl::Status StepStaging::FromOwners(const scheduler::Bucket& bucket,
                                     const StepRequest& request) {
  const kernels::MuonHyperparameters& h = plan_.muon;
  // Updates travel in the precision Newton-Schulz ran in (bf16 halves the
  // bytes of fp32), and every rank, the owner included, applies the same
  // rounded values.
  const DType dtype = plan_.update_dtype;
  const int64_t width = static_cast<int64_t>(DTypeSize(dtype));
  // One NCCL group for the bucket's updates, inside its run's (a launch
  // costs the host tens of microseconds: per matrix, that was what a small
  // model's step spent sending them back). The owner's own copies are
  // enqueued at once, ahead of the group's transfers, on the same stream.
  // Updates of unreduced matrices summed in two levels go back the
  // reverse way after the run's group, in launches of their own
  // (GatherExchanged).
  std::vector<ExchangeItem> exchanged;
  std::vector<ParamApply> exchange_applies;
  // The run's relays (its group is inside the run's: they pass the rows on
  // after it, ForwardRelayed).
  if (relayed_updates_ == nullptr) relayed_updates_ = Relay();
  RowRelay& relay = *relayed_updates_;
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (const scheduler::Transfer& x : bucket.from_owners) {
    if (x.group != plan_.group) continue;  // another owner group's
    const scheduler::MatrixSpec& spec = plan_.matrices[x.item.matrix];
    const Binding* b =
        trainer_ == nullptr ? nullptr : &trainer_->matrices[x.item.matrix];
    // The step's values, its group's where given (by index, attached once).
    double lr = request.lr >= 0 ? request.lr : h.lr;
    double wd =
        request.weight_decay >= 0 ? request.weight_decay : h.weight_decay;
    if (b != nullptr && b->group >= 0 &&
        b->group < static_cast<int>(request.groups.size())) {
      const GroupHyperparameters& g = request.groups[b->group];
      if (g.lr >= 0) lr = g.lr;
      if (g.weight_decay >= 0) wd = g.weight_decay;
    }
    const int64_t size = spec.rows * spec.cols;
    const int64_t e = x.item.expert;
    const bool mine = x.owner == plan_.rank;
    // The owner's Newton-Schulz result (fp32). Its staging gets the result
    // rounded to `dtype` directly; what leaves from the owner's own memory
    // (a scatter's rows, or an owner with no trainer) is rounded into the
    // stack's update buffer first, on this stream (fp32: the result itself).
    const float* result = nullptr;
    void* update = nullptr;
    if (mine) {
      const ItemSlot& s = momentum_.slot(x.item.matrix, e);
      result = plan_.StagedData(s);
      update = plan_.UpdateData(s);
    }
    const auto round_update = [&]() -> absl::Status {
      if (dtype == kF32) return absl::OkStatus();
      return ops_.FromFloat(update, dtype, result, size, stream_);
    };
    ParamApply apply;
    apply.matrix = x.item.matrix;
    // Step size from the whole matrix's shape, even for a row shard.
    apply.decay = static_cast<float>(1.0 - lr * wd);
    apply.step = static_cast<float>(
        -kernels::AdjustedLr(lr, h.lr_adjustment, spec.rows, spec.cols));
    if (x.kind == scheduler::TransferKind::kExchangeFromOwner) {
      ExchangeItem& item = exchanged.emplace_back();
      item.size = size;
      item.owner = x.owner;
      if (mine) {
        MUONPS_RETURN_IF_ERROR(round_update());
        item.update = update;
      }
      if (b == nullptr) continue;  // no parameter here
      apply.count = size;
      apply.first = e * size;
      apply.staged_at = b->staged_at + apply.first;
      item.landing = trainer_->updates.at(apply.staged_at);
      exchange_applies.push_back(apply);
      continue;
    }
    if (x.kind == scheduler::TransferKind::kScatterFromOwner &&
        !FullParam(x.item.matrix)) {
      // Across nodes, through relays (row_relay.h): every rank takes part.
      const bool relayed =
          scheduler::RelaysRows(plan_.schedule.exchange_nodes, spec);
      if (mine) MUONPS_RETURN_IF_ERROR(round_update());
      if (mine && !relayed) {
        for (const int r : plan_.group_members) {
          if (r == plan_.rank || roster_.trainer_rank_of[r] < 0) continue;
          const ExpertPart part =
              PartOfExpert(spec, e, roster_.trainer_rank_of[r]);
          const int64_t count = part.rows() * spec.cols;
          if (count == 0) continue;
          MUONPS_RETURN_IF_ERROR(t_.Send(
              kernels::ElementsPast(update, dtype, part.row_begin * spec.cols),
              count, dtype, r, stream_));
          bytes_ += count * width;
        }
      }
      const ExpertPart part =
          b == nullptr ? ExpertPart{} : PartOfExpert(spec, e, trainer_->rank);
      // No rows to apply here (no trainer, or an expert another trainer
      // holds): a relay's part only.
      if (part.rows() == 0) {
        if (relayed) {
          MUONPS_RETURN_IF_ERROR(relay.Scatter(spec, e, x.owner, dtype,
                                               mine ? update : nullptr, nullptr,
                                               &bytes_));
        }
        continue;
      }
      apply.count = part.rows() * spec.cols;
      apply.first = part.first_row * spec.cols;
      apply.staged_at = b->staged_at + apply.first;
      void* staged = trainer_->updates.at(apply.staged_at);
      if (mine) {
        MUONPS_RETURN_IF_ERROR(
            ops_.FromFloat(staged, dtype, result + part.row_begin * spec.cols,
                           apply.count, stream_));
      }
      if (relayed) {
        MUONPS_RETURN_IF_ERROR(relay.Scatter(spec, e, x.owner, dtype,
                                             mine ? update : nullptr,
                                             mine ? nullptr : staged, &bytes_));
      } else if (!mine) {
        MUONPS_RETURN_IF_ERROR(
            t_.Recv(staged, apply.count, dtype, x.owner, stream_));
        bytes_ += apply.count * width;
      }
    } else if (plan_.windows.Writes(x.owner) && !x.by_collective) {
      // The owner writes the update into every trainer's staging (peer
      // copies: staging_windows.h); the others receive nothing. Not the
      // updates of its last stack among more than two workers: those go by
      // broadcast, below (Transfer::by_collective).
      if (mine) {
        if (b != nullptr) {  // its own trainer's staging is the source
          update = trainer_->updates.at(b->staged_at + e * size);
          MUONPS_RETURN_IF_ERROR(
              ops_.FromFloat(update, dtype, result, size, stream_));
        } else {
          MUONPS_RETURN_IF_ERROR(round_update());
        }
        const int64_t at = plan_.window_at[x.item.matrix] + e * size;
        for (const int r : plan_.group_members) {
          if (r == plan_.rank || roster_.trainer_rank_of[r] < 0) continue;
          MUONPS_RETURN_IF_ERROR(ops_.CopyBytes(plan_.windows.At(r, at * width),
                                                update, size * width, stream_));
          plan_.windows.CountWrite(size * width);
          bytes_ += size * width;
          if (std::find(written_to_.begin(), written_to_.end(), r) ==
              written_to_.end()) {
            written_to_.push_back(r);
          }
        }
      }
      if (b == nullptr) continue;  // no parameter here
      if (!mine) {
        plan_.windows.CountReceived(size * width);
        bytes_ += size * width;
        apply.writer = x.owner;
        apply.run = run_;
      }
      apply.count = size;
      apply.first = e * size;
      apply.staged_at = b->staged_at + apply.first;
    } else {
      bytes_ += size * width;
      if (b == nullptr) {  // no parameter here: only the owner's part
        void* landing =
            mine ? update
                 : kernels::ElementsPast(plan_.sink->data(), dtype, landed_);
        if (mine) MUONPS_RETURN_IF_ERROR(round_update());
        if (!mine) landed_ += size;
        MUONPS_RETURN_IF_ERROR(t_.BroadcastIn(transport::Split::kOwnerGroups,
                                              landing, size, dtype, x.owner,
                                              stream_));
        continue;
      }
      apply.count = size;
      apply.first = e * size;
      apply.staged_at = b->staged_at + apply.first;
      void* staged = trainer_->updates.at(apply.staged_at);
      if (mine) {
        MUONPS_RETURN_IF_ERROR(
            ops_.FromFloat(staged, dtype, result, size, stream_));
      }
      MUONPS_RETURN_IF_ERROR(t_.BroadcastIn(transport::Split::kOwnerGroups,
                                            staged, size, dtype, x.owner,
                                            stream_));
    }
    ledger_.staged.applies.push_back(apply);
  }
  if (!exchanged.empty()) {
    gathers_.push_back({std::move(exchanged), std::move(exchange_applies)});
  }
  return t_.GroupEnd();
}

absl::Status StepStaging::ForwardRelayed() {
  if (relayed_updates_ == nullptr) return absl::OkStatus();
  const absl::Status forwarded = relayed_updates_->Forward(&bytes_);
  relayed_updates_.reset();
  return forwarded;
}

absl::Status StepStaging::GatherExchanged() {
  if (gathers_.empty()) return absl::OkStatus();
  ExchangePipeline pipeline(plan_.schedule.exchange_nodes, plan_.rank, t_, ops_,
                            plan_.exchange, stream_,
                            ExchangePipeline::Way::kGather, plan_.update_dtype);
  for (size_t g = 0; g < gathers_.size(); ++g) {
    MUONPS_RETURN_IF_ERROR(pipeline.Push(
        static_cast<int>(g), std::move(gathers_[g].items), &bytes_));
  }
  MUONPS_RETURN_IF_ERROR(pipeline.Drain(&bytes_));
  for (ExchangeGather& g : gathers_) {
    for (const ParamApply& apply : g.applies) {
      ledger_.staged.applies.push_back(apply);
    }
  }
  gathers_.clear();
  return absl::OkStatus();
}

absl::Status StepStaging::AverageAdamWGradients() {
  const float inverse = 1.0f / static_cast<float>(trainers_);
  if (trainer_ == nullptr) {  // zeros in, the means received and dropped
    // The trainers' groups, call for call; each mean has its own place in
    // the sink.
    MUONPS_RETURN_IF_ERROR(t_.GroupStart());
    for (const int64_t n : roster_.follower_adamw) {
      MUONPS_RETURN_IF_ERROR(t_.ReduceSum(plan_.zeros->data(),
                                          plan_.sink->data(), n, 0,
                                          roster_.reduce_order, stream_));
    }
    MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
    MUONPS_RETURN_IF_ERROR(t_.GroupStart());
    int64_t at = 0;
    for (const int64_t n : roster_.follower_adamw) {
      MUONPS_RETURN_IF_ERROR(
          t_.Broadcast(plan_.sink->data() + at, n, kF32, 0, stream_));
      at += n;
    }
    return t_.GroupEnd();
  }
  // Three launches in all: every sum to rank 0 in one NCCL group, its
  // scaling, every mean back in another (the groups are stream-ordered; the
  // calls inside one are not).
  std::vector<int> means;
  for (size_t i = 0; i < trainer_->adamw.size(); ++i) {
    if (trainer_->adamw[i].second.layout == scheduler::Layout::kUnreduced) {
      means.push_back(static_cast<int>(i));
    }
  }
  // The mean waits in the trainer's `means` until the step commits.
  const auto mean_of = [&](const Binding& b) {
    return trainer_->means->data() + b.staged_at;
  };
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (const int i : means) {
    const Binding& b = trainer_->adamw[i].second;
    MUONPS_RETURN_IF_ERROR(t_.ReduceSum(b.grad, mean_of(b), b.elements, 0,
                                        roster_.reduce_order, stream_));
  }
  MUONPS_RETURN_IF_ERROR(t_.GroupEnd());
  for (const int i : means) {
    const Binding& b = trainer_->adamw[i].second;
    if (plan_.rank == 0) {
      MUONPS_RETURN_IF_ERROR(
          ops_.Scale(mean_of(b), b.elements, inverse, stream_));
    }
  }
  MUONPS_RETURN_IF_ERROR(t_.GroupStart());
  for (const int i : means) {
    const Binding& b = trainer_->adamw[i].second;
    MUONPS_RETURN_IF_ERROR(
        t_.Broadcast(mean_of(b), b.elements, kF32, 0, stream_));
    bytes_ += 2 * b.elements * 4;
    ledger_.staged.means.push_back(i);
  }
  return t_.GroupEnd();
}

}  // namespace worker
}  // namespace muonps
