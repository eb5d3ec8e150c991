#include "server/worker/step_run.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

StepRun::StepRun(const StepContext& context)
    : plan_(*context.plan),
      trainer_(context.trainer),
      t_(*context.transport),
      ops_(*context.ops),
      kernels_(*context.kernels),
      ledger_(*context.ledger),
      context_(context),
      stream_(context.ops->stream()),
      compute_(context.ops->compute_stream()),
      trainers_(context.plan->trainers()),
      control_(context.transport, context.ops, context.plan->scratch.get(),
               context.timeout) {}

std::string StepRun::LocalProblem(const StepRequest& request) {
  if (trainer_ == nullptr) return "";
  if (!intact_.ok()) return std::string(intact_.message());
  if (context_.cancelled && context_.cancelled()) {
    return "the trainer's Step call was cancelled or passed its deadline";
  }
  std::string problem = StepRequestProblem(request, trainer_->group_count);
  if (!problem.empty()) return problem;
  const AttachedTrainer& trainer = *trainer_;
  // Each worker checks the gradients this step reads from its trainer, so
  // every gradient the step reads is checked before anything changes. A
  // replicated gradient is read only by its owner's worker (every trainer
  // holds the same one), or, for an owner with no trainer, by trainer 0's
  // worker, which sends it: checking it everywhere read it N times over.
  const auto reads = [&](size_t m) {
    if (plan_.matrices[m].layout != scheduler::Layout::kReplicated) {
      return true;  // every trainer's part or rows are read
    }
    for (const int32_t owner : plan_.ownership.owners[m]) {
      if (owner == plan_.rank) return true;
      if (owner >= plan_.trainers() && trainer.rank == 0) return true;
    }
    return false;
  };
  // Spans by job matrix, then the AdamW tensors; a name is looked up only
  // for the span that is not finite.
  std::vector<kernels::FloatSpan> spans;
  std::vector<int> matrix_of;  // by span; -1 - i: AdamW tensor i
  for (size_t m = 0; m < plan_.matrices.size(); ++m) {
    if (!reads(m)) continue;
    spans.push_back({trainer.matrices[m].grad, trainer.matrices[m].elements});
    matrix_of.push_back(static_cast<int>(m));
  }
  for (size_t i = 0; i < trainer.adamw.size(); ++i) {
    spans.push_back(
        {trainer.adamw[i].second.grad, trainer.adamw[i].second.elements});
    matrix_of.push_back(-1 - static_cast<int>(i));
  }
  absl::StatusOr<std::vector<int64_t>> bad =
      ops_.FirstNonFinite(spans, stream_);
  if (!bad.ok()) return absl::StrCat("finite check: ", bad.status().message());
  for (size_t k = 0; k < spans.size(); ++k) {
    if ((*bad)[k] < 0) continue;
    float value = 0;
    const bool read =
        ops_.Copy(&value, spans[k].data + (*bad)[k], 1, stream_).ok() &&
        ops_.Synchronize(stream_).ok();
    const std::string& name = matrix_of[k] >= 0
                                  ? plan_.matrices[matrix_of[k]].name
                                  : trainer.adamw[-1 - matrix_of[k]].first;
    return absl::StrCat("grad of ", Quoted(name), ": element ", (*bad)[k],
                        " is ",
                        !read               ? "not finite"
                        : std::isnan(value) ? "NaN"
                                            : "Inf");
  }
  return "";
}

absl::Status StepRun::WidenGradients() {
  auto widen = [&](const Binding& b) {
    if (b.dtype == DType::kFloat32) return absl::OkStatus();
    return ops_.ToFloat(b.grad, b.lent_grad, b.dtype, b.elements, stream_);
  };
  for (const Binding& b : trainer_->matrices) {
    MUONPS_RETURN_IF_ERROR(widen(b));
  }
  for (const auto& [name, b] : trainer_->adamw) {
    MUONPS_RETURN_IF_ERROR(widen(b));
  }
  return absl::OkStatus();
}

absl::Status StepRun::Agree(const StepRequest& request,
                            RoundDecision* decision) {
  const int size = t_.size();
  StepHeader mine{};
  mine.step_id = trainer_ == nullptr ? -1 : request.step_id;
  mine.last_step = ledger_.last.load();
  mine.staged_step = ledger_.staged.voted ? ledger_.staged.step_id : -1;
  mine.staged_decider = ledger_.staged.decider;
  mine.instance = ledger_.instance;
  mine.hyper_hash = HyperHash(request);
  mine.trainer_rank = trainer_ == nullptr ? -1 : trainer_->rank;
  mine.trainer_count = trainer_ == nullptr ? 0 : trainer_->count;
  if (trainer_ != nullptr) {
    mine.tensors_hash = trainer_->tensors_hash;
  }
  CopyProblem(LocalProblem(request), mine.problem);
  *decision = RoundDecision{};
  std::vector<StepHeader> headers(size, StepHeader{});
  if (plan_.rank == 0) {
    // Workers with no trainer learn of the round from rank 0.
    for (int r = trainers_; r < size; ++r) {
      MUONPS_RETURN_IF_ERROR(
          control_.Send(RoundOpening{kRoundOpeningMagic, 0}, r));
    }
    headers[0] = mine;
    for (int r = 1; r < size; ++r) {
      MUONPS_RETURN_IF_ERROR(control_.Recv(&headers[r], r));
    }
    *decision = DecideRound(headers, trainers_, plan_.ownership.worker_ids,
                            ledger_.instance);
  } else {
    if (trainer_ == nullptr) {
      RoundOpening opening{};
      MUONPS_RETURN_IF_ERROR(control_.Recv(&opening, 0));
      if (opening.magic != kRoundOpeningMagic) {
        return absl::InternalError("rank 0 opened a round with another wire");
      }
    }
    MUONPS_RETURN_IF_ERROR(control_.Send(mine, 0));
  }
  MUONPS_RETURN_IF_ERROR(control_.Broadcast(decision, 0));
  if (static_cast<RoundKind>(decision->kind) != RoundKind::kGo) {
    return absl::OkStatus();
  }
  trainer_rank_of_.assign(size, -1);
  for (int r = 0; r < size && plan_.rank == 0; ++r) {
    trainer_rank_of_[r] = headers[r].trainer_rank;
  }
  MUONPS_RETURN_IF_ERROR(
      control_.Broadcast(trainer_rank_of_.data(), sizeof(int32_t) * size, 0));
  // Trainer order, then the ranks with no trainer (their parts are zeros,
  // added last: the sums keep the bits of the trainers' parts alone).
  reduce_order_.assign(size, 0);
  for (int r = 0; r < size; ++r) {
    // A permutation once agreed (rank 0 checked it); clamp before that.
    const int32_t trainer = trainer_rank_of_[r];
    if (trainer >= 0 && trainer < trainers_) reduce_order_[trainer] = r;
    if (r >= trainers_) reduce_order_[r] = r;
  }
  if (plan_.ownership.dedicated > 0) {
    MUONPS_RETURN_IF_ERROR(ShareFollowerInfo());
  }
  return absl::OkStatus();
}

absl::Status StepRun::Resolve(const RoundDecision& decision) {
  if (!decision.resolve) return absl::OkStatus();
  StagedStep& staged = ledger_.staged;
  if (staged.voted && staged.step_id <= decision.committed) {
    // Some rank committed it: so does this one, from its staging.
    MUONPS_RETURN_IF_ERROR(CommitStaged(ledger_, plan_, trainer_, ops_));
  } else if (staged.step_id >= 0) {
    DropStaged(ledger_, plan_);
  }
  ledger_.settled = std::max(ledger_.settled, decision.committed);
  return absl::OkStatus();
}

RoundResult StepRun::Run(const StepRequest& request) {
  host_.begin = std::chrono::steady_clock::now();
  RoundResult out;
  if (trainer_ != nullptr) {
    // The worker's stream waits for the trainer's gradients (CUDA: an
    // event, no host waits). Memory that is no longer whole is not read
    // (the round is refused everywhere through the agreement).
    intact_ = trainer_->buffers->CheckIntact();
    if (intact_.ok()) {
      out.status = trainer_->buffers->WaitForTrainer(stream_);
      if (out.status.ok()) out.status = WidenGradients();
      if (!out.status.ok()) {
        out.transport_ok = true;  // nothing was sent yet
        return out;
      }
    }
  }
  if (context_.hook && trainer_ != nullptr) {
    context_.hook(StepPoint::kExchange, request.step_id, plan_.rank);
  }
  RoundDecision decision;
  out.status = Agree(request, &decision);
  host_.agreed = std::chrono::steady_clock::now();
  if (out.status.ok()) out.status = Resolve(decision);
  if (!out.status.ok()) {
    out.transport_ok = false;
    return out;
  }
  switch (static_cast<RoundKind>(decision.kind)) {
    case RoundKind::kReject:
      out.status = absl::Status(static_cast<absl::StatusCode>(decision.code),
                                ProblemText(decision.problem));
      return out;
    case RoundKind::kNoStep:
      out.kind = trainer_ == nullptr ? RoundResult::Kind::kNoStep
                 : request.step_id <= decision.committed
                     ? RoundResult::Kind::kAlreadyApplied
                     : RoundResult::Kind::kAgain;
      return out;
    case RoundKind::kGo:
      return Stage(request, decision);
  }
  out.status = absl::InternalError(
      absl::StrCat("rank 0 decided round kind ", decision.kind));
  out.transport_ok = false;
  return out;
}

RoundResult StepRun::Stage(const StepRequest& request,
                           const RoundDecision& decision) {
  const auto start = std::chrono::steady_clock::now();
  step_id_ = decision.step_id;
  DropStaged(ledger_, plan_);  // a voted one was resolved in Agree's round
  ledger_.means_step = -1;     // the staging is about to be overwritten
  StagedStep& staged = ledger_.staged;
  staged.step_id = step_id_;
  staged.decider = decision.decider;
  // Transfers on stream_, this worker's stacks on compute_, each side
  // waiting for the other only where it reads what the other wrote (no
  // host waits). Every bucket's gradients to owners are issued first, in
  // the schedule's order, each followed by a mark; then the schedule's
  // compute and updates back. A stack waits for the mark of the bucket
  // that completes it, never for updates going back (each stack has its
  // own slot, read from there into the trainer's staging), so no bucket is
  // a barrier among the workers, and gradients keep moving while stacks
  // compute. Every rank issues the same transfers in the same order.
  absl::Status ready = [&]() -> absl::Status {
    ops_.ClearMarks();
    timeline_.clear();
    MUONPS_ASSIGN_OR_RETURN(const int begin, ops_.Mark(stream_));
    timeline_.push_back({"begin", -1, begin});
    // bucket_mark[j]: the mark after the gradients of buckets up to j (in
    // arrival order) moved; a stack ready with j reads nothing later.
    std::vector<int> bucket_mark(plan_.schedule.buckets.size(), begin);
    int moved = begin;
    bool first = true;
    for (const scheduler::Phase& phase : plan_.schedule.order) {
      if (phase.kind != scheduler::PhaseKind::kToOwners) continue;
      const scheduler::Bucket& bucket = plan_.schedule.buckets[phase.index];
      MUONPS_RETURN_IF_ERROR(ToOwners(bucket));
      if (first && context_.hook) {
        context_.hook(StepPoint::kTransfer, step_id_, plan_.rank);
      }
      first = false;
      if (!bucket.to_owners.empty()) {
        MUONPS_ASSIGN_OR_RETURN(moved, ops_.Mark(stream_));
        timeline_.push_back({"to_owners", phase.index, moved});
      }
      bucket_mark[phase.index] = moved;
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
    const auto issue_next = [&]() -> absl::Status {
      const int stack = own[issued];
      const int needed = bucket_mark[plan_.schedule.stacks[stack].ready_bucket];
      if (needed > waited) {
        MUONPS_RETURN_IF_ERROR(ops_.WaitForMark(compute_, needed));
        waited = needed;
      }
      MUONPS_ASSIGN_OR_RETURN(const int began, ops_.Mark(compute_));
      timeline_.push_back({"compute_begin", stack, began});
      MUONPS_RETURN_IF_ERROR(
          Compute(plan_.batches[plan_.batch_of_stack[stack]]));
      MUONPS_ASSIGN_OR_RETURN(done_mark[issued], ops_.Mark(compute_));
      timeline_.push_back({"compute", stack, done_mark[issued]});
      ++issued;
      return absl::OkStatus();
    };
    for (const scheduler::Phase& phase : plan_.schedule.order) {
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
          if (reached > ordered) {
            MUONPS_RETURN_IF_ERROR(
                ops_.WaitForMark(stream_, done_mark[reached - 1]));
            ordered = reached;
          }
          MUONPS_RETURN_IF_ERROR(
              FromOwners(plan_.schedule.buckets[phase.index], request));
          MUONPS_ASSIGN_OR_RETURN(const int done, ops_.Mark(stream_));
          timeline_.push_back({"from_owners", phase.index, done});
          break;
        }
      }
    }
    if (reached > ordered) {
      MUONPS_RETURN_IF_ERROR(ops_.WaitForMark(stream_, done_mark[reached - 1]));
    }
    MUONPS_RETURN_IF_ERROR(AverageAdamWGradients());
    // Staged when the transport's work and the stream are: a lost peer
    // fails here within the timeout instead of hanging.
    MUONPS_RETURN_IF_ERROR(t_.Synchronize(stream_, context_.timeout));
    MUONPS_RETURN_IF_ERROR(ops_.Synchronize(stream_));
    host_.staged = std::chrono::steady_clock::now();
    return absl::OkStatus();
  }();
  RoundResult out;
  if (!ready.ok()) {
    // Out of step with the peers: no vote can reach rank 0.
    DropStaged(ledger_, plan_);
    out.status = ready;
    out.transport_ok = false;
    return out;
  }
  const CommitOutcome commit =
      RunCommitPhases(step_id_, ready, control_, plan_.rank, t_.size(),
                      plan_.ownership.worker_ids, ledger_, plan_, trainer_,
                      ops_, context_.cancelled, context_.hook);
  out.status = commit.status;
  out.transport_ok = commit.transport_ok;
  out.kind = RoundResult::Kind::kStepped;
  out.response.step_id = step_id_;
  out.response.plan_version = plan_.version;
  out.response.seconds = SecondsSince(start);
  out.response.bytes_moved = bytes_;
  out.response.predicted_ns_seconds = PredictedComputeSeconds();
  if (commit.status.ok()) {
    // The marks are done: the stream waited for the compute stream.
    const absl::StatusOr<std::vector<double>> ms = ops_.MarkTimesMs();
    if (ms.ok()) {
      out.response.ns_seconds = ComputeBusyMs(*ms) / 1e3;
      LogTimeline(*ms);
    } else {
      spdlog::debug("step {}: no timeline: {}", step_id_,
                    ms.status().ToString());
    }
  }
  return out;
}

}  // namespace worker
}  // namespace muonps
