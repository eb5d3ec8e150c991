#include "server/worker/step_run.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/momentum_store.h"
#include "server/worker/param_repair.h"
#include "server/worker/step_agreement.h"
#include "server/worker/step_staging.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// What undoing `staging`'s early applies (StepStaging::UndoEarlyApplies)
// leaves of the round's `status`: as it was, or DATA_LOSS when putting the
// parameters back failed.
absl::Status Undone(StepStaging& staging, const absl::Status& status) {
  const absl::Status undone = staging.UndoEarlyApplies();
  if (undone.ok()) return status;
  return absl::DataLossError(
      absl::StrCat("putting back the parameters this worker had updated "
                   "before the step was decided failed (",
                   undone.message(), "), after: ", status.message()));
}

}  // namespace

StepRun::StepRun(const StepContext& context)
    : context_(context),
      plan_(*context.plan),
      ledger_(*context.ledger),
      control_(context.transport, context.ops, context.plan->scratch.get(),
               context.timeout) {}

RoundResult StepRun::Run(const StepRequest& request) {
  const AttachedTrainer* const trainer = context_.trainer;
  RoundResult out;
  // Memory that is no longer whole is not read (the round is refused
  // everywhere through the agreement). Nothing here waits for the
  // trainer's gradients: the agreement reads none, so the ranks agree while
  // backward still runs, and the stage waits for each bucket's gradients
  // on the device (StepStaging).
  absl::Status intact;
  if (trainer != nullptr) intact = trainer->buffers->CheckIntact();
  if (context_.hook && trainer != nullptr) {
    context_.hook(StepPoint::kExchange, request.step_id, plan_.rank);
  }
  RoundAgreement agreement(plan_, trainer, ledger_, control_, *context_.ops,
                           context_.cancelled);
  // The next step, on momentum as of the one before and with nothing in
  // doubt: its first stack computes while the ranks agree, when it needs
  // nothing from them. A round that runs anything else drops it. Only
  // under the plan version that committed the step before: after a plan
  // change the momentum may still be on its way (a handover, a restore).
  std::unique_ptr<StepStaging> staging;
  if (trainer != nullptr && intact.ok() && ledger_.staged.step_id < 0 &&
      !ledger_.trainer_behind.has_value() &&
      ledger_.last.load() == request.step_id - 1 &&
      ledger_.last_version.load() == plan_.version) {
    staging = NewStaging(agreement.roster(), request.step_id);
    out.status = staging->ComputeAhead(request.step_id);
    if (!out.status.ok()) {
      DropStaged(ledger_, plan_);
      out.transport_ok = true;  // nothing was sent yet
      return out;
    }
  }
  RoundDecision decision;
  out.status = agreement.Agree(request, intact, &decision);
  timeline_.Agreed();
  const bool go = out.status.ok() &&
                  static_cast<RoundKind>(decision.kind) == RoundKind::kGo &&
                  decision.step_id == request.step_id;
  if (out.status.ok() && trainer != nullptr && intact.ok() &&
      (!go || agreement.ResolveCommits(decision))) {
    // What writes the trainer's memory outside a step's stage (a staged
    // step resolved, a repair, means given again) comes after the trainer
    // wrote its gradients, as the stage's own commit does.
    out.status = trainer->buffers->WaitForTrainer(context_.ops->stream());
  }
  if (out.status.ok()) out.status = agreement.Resolve(decision);
  if (staging != nullptr && !go) {
    DropStaged(ledger_, plan_);
    staging.reset();
  }
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
      out.kind = trainer == nullptr ? RoundResult::Kind::kNoStep
                 : request.step_id <= decision.committed
                     ? RoundResult::Kind::kAlreadyApplied
                     : RoundResult::Kind::kAgain;
      return out;
    case RoundKind::kGo:
      return Stage(request, decision, agreement.roster(), std::move(staging));
    case RoundKind::kRepair:
      out.status =
          RepairParameters(decision, plan_, trainer, *context_.transport,
                           *context_.ops, ledger_, context_.timeout);
      if (!out.status.ok()) {
        out.transport_ok = false;
        return out;
      }
      out.repaired = decision.params != 0 && decision.target == plan_.rank;
      // As kNoStep, for a trainer whose parameters hold the step now.
      out.kind = trainer == nullptr ? RoundResult::Kind::kNoStep
                 : request.step_id <= decision.committed &&
                         ledger_.params_step() >= decision.committed
                     ? RoundResult::Kind::kAlreadyApplied
                     : RoundResult::Kind::kAgain;
      return out;
  }
  out.status = absl::InternalError(
      absl::StrCat("rank 0 decided round kind ", decision.kind));
  out.transport_ok = false;
  return out;
}

std::unique_ptr<StepStaging> StepRun::NewStaging(const StepRoster& roster,
                                                 int64_t step_id) {
  DropStaged(ledger_, plan_);  // a voted one was resolved in Agree's round
  // The step stages on momentum as of the step before, nothing older.
  if (plan_.momentum != nullptr) plan_.momentum->CheckMomentumStep(step_id);
  return std::make_unique<StepStaging>(
      plan_, context_.trainer, *context_.transport, *context_.ops,
      *context_.kernels, ledger_, roster, timeline_, context_.hook,
      context_.timeout);
}

RoundResult StepRun::Stage(const StepRequest& request,
                           const RoundDecision& decision,
                           const StepRoster& roster,
                           std::unique_ptr<StepStaging> ahead) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t step_id = decision.step_id;
  const AttachedTrainer* const trainer = context_.trainer;
  kernels::DeviceOps& ops = *context_.ops;
  ledger_.means_step = -1;  // the staging is about to be overwritten
  RoundResult out;
  out.response.computed_ahead = ahead != nullptr && ahead->ahead();
  std::unique_ptr<StepStaging> staging =
      ahead != nullptr ? std::move(ahead) : NewStaging(roster, step_id);
  StagedStep& staged = ledger_.staged;
  staged.step_id = step_id;
  staged.decider = decision.decider;
  // Each stack's updates go into the parameters as they land. Alone, with
  // nothing to agree on once the gradients are checked, decided then; not
  // when backward signals gradients one by one: their stacks start beside
  // backward, where a decision would wait for all of it. Among several
  // workers, before the votes, undone unless the step commits.
  if (trainer != nullptr && context_.apply_early &&
      context_.apply_early(step_id) &&
      !(context_.cancelled && context_.cancelled())) {
    if (context_.transport->size() == 1 &&
        std::all_of(trainer->matrices.begin(), trainer->matrices.end(),
                    [](const Binding& b) { return b.ready < 0; })) {
      staging->ApplyAsLanded(EarlyApply::kDecided);
    } else if (context_.transport->size() > 1 && trainer->kept != nullptr) {
      staging->ApplyAsLanded(EarlyApply::kUndoable);
    }
  }
  absl::Status ready = staging->Stage(step_id, request);
  if (!ready.ok() && staged.decided_early()) {
    DropStaged(ledger_, plan_);
    out.status = absl::DataLossError(absl::StrCat(
        "step ", step_id,
        ": applying it failed part-way on this worker: ", ready.message()));
    out.transport_ok = false;
    return out;
  }
  if (!ready.ok()) {
    // Out of step with the peers: no vote can reach rank 0.
    out.status = Undone(*staging, ready);
    DropStaged(ledger_, plan_);
    out.transport_ok = false;
    return out;
  }
  // Every gradient it read, checked before anything changes: a
  // non-finite one votes no, naming it.
  ready = staging->GradientsFinite();
  if (ready.ok() && context_.persist) ready = context_.persist(step_id);
  const CommitOutcome commit = RunCommitPhases(
      step_id, ready, control_, plan_.rank, context_.transport->size(),
      plan_.ownership.worker_ids, ledger_, plan_, trainer, ops,
      context_.cancelled, context_.hook);
  out.status = commit.status;
  // Not committed here, nor to be: the parameters as they were.
  if (!commit.decided) out.status = Undone(*staging, out.status);
  out.transport_ok = commit.transport_ok;
  out.kind = RoundResult::Kind::kStepped;
  out.response.step_id = step_id;
  out.response.plan_version = plan_.version;
  // From the step's first work: a stack computed ahead of the round counts.
  out.response.seconds =
      SecondsSince(std::min(start, timeline_.FirstIssued(start)));
  out.response.bytes_moved = staging->bytes();
  out.response.applied_early = staging->applied_early();
  out.response.predicted_ns_seconds = PredictedComputeSeconds(plan_);
  if (commit.status.ok()) {
    // The marks are done: the stream waited for the compute stream.
    const absl::StatusOr<std::vector<double>> ms = ops.MarkTimesMs();
    if (ms.ok()) {
      out.response.ns_seconds = timeline_.ComputeBusyMs(*ms) / 1e3;
      timeline_.Log(*ms, step_id, plan_);
    } else {
      spdlog::debug("step {}: no timeline: {}", step_id,
                    ms.status().ToString());
    }
  }
  return out;
}

}  // namespace worker
}  // namespace muonps
