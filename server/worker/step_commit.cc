#include "server/worker/step_commit.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/worker/momentum_store.h"
#include "server/worker/step_protocol.h"

namespace muonps {
namespace worker {
namespace {

std::string Who(const std::vector<std::string>& ids, int rank) {
  return rank >= 0 && rank < static_cast<int>(ids.size())
             ? absl::StrCat("worker ", Quoted(ids[rank]))
             : absl::StrCat("rank ", rank);
}

// This rank voted yes and did not hear the decision.
absl::Status InDoubt(int64_t step, const absl::Status& why) {
  return absl::UnavailableError(absl::StrCat(
      "step ", step, ": the commit decision of rank 0 did not arrive (",
      why.message(),
      "); nothing was applied on this worker yet and it keeps the step "
      "staged: a retry of step ",
      step, " applies it exactly once or redoes it"));
}

// Committed here; not every rank confirmed it.
absl::Status Unconfirmed(int64_t step, const absl::Status& why) {
  return absl::UnavailableError(absl::StrCat(
      "step ", step,
      " was applied on this worker, but not every worker confirmed it (",
      why.message(), "): retry step ", step,
      ", which reports it already applied once every worker has it"));
}

// `code`: the refusing rank's. INVALID_ARGUMENT (a request or gradient no
// retry fixes: a non-finite gradient) reaches every rank as it is; any other
// refusal is ABORTED here (a retry may run the step).
absl::Status Aborted(int64_t step, absl::StatusCode code,
                     const std::string& why) {
  return absl::Status(code == absl::StatusCode::kInvalidArgument
                          ? code
                          : absl::StatusCode::kAborted,
                      absl::StrCat("step ", step,
                                   " aborted on every worker, nothing "
                                   "was applied: ",
                                   why));
}

}  // namespace

const char* StepPointName(StepPoint point) {
  switch (point) {
    case StepPoint::kExchange:
      return "exchange";
    case StepPoint::kTransfer:
      return "transfer";
    case StepPoint::kPrepared:
      return "prepared";
    case StepPoint::kCommitted:
      return "committed";
    case StepPoint::kDecided:
      return "decided";
  }
  return "?";
}

// Staged means of the trainer's unreduced AdamW tensors `means` into its
// lent gradients, in stream order.
absl::Status WriteMeans(const std::vector<int>& means,
                        const AttachedTrainer& trainer,
                        kernels::DeviceOps& ops) {
  for (const int i : means) {
    const Binding& b = trainer.adamw[i].second;
    const float* mean = trainer.means->data() + b.staged_at;
    MUONPS_RETURN_IF_ERROR(b.dtype == DType::kFloat32
                               ? ops.Copy(static_cast<float*>(b.lent_grad),
                                          mean, b.elements, ops.stream())
                               : ops.FromFloat(b.lent_grad, b.dtype, mean,
                                               b.elements, ops.stream()));
  }
  return absl::OkStatus();
}

// Writes `staged`'s updates into the trainer's parameters in the order its
// attach request bound the matrices. With `progress` (the trainer waits for
// this step) the parameters' progress word follows, each time another
// kProgressBytes or more of them were written and a matrix is whole.
absl::Status WriteParameters(StagedStep& staged, const AttachedTrainer& trainer,
                             kernels::DeviceOps& ops, bool progress) {
  constexpr int64_t kProgressBytes = int64_t{4} << 20;
  const Stream stream = ops.stream();
  std::vector<ParamApply>& applies = staged.applies;
  const std::vector<int>& position = trainer.bound_position;
  std::sort(applies.begin(), applies.end(),
            [&position](const ParamApply& a, const ParamApply& b) {
              return std::make_pair(position[a.matrix], a.first) <
                     std::make_pair(position[b.matrix], b.first);
            });
  int64_t unsignaled = 0;  // bytes written since the word last moved
  for (size_t i = 0; i < applies.size(); ++i) {
    const ParamApply& a = applies[i];
    const Binding& b = trainer.matrices[a.matrix];
    if (!a.applied) {  // else in place already: whole at every word
      MUONPS_RETURN_IF_ERROR(ApplyUpdates({a}, trainer, ops, stream));
      unsignaled += a.count * static_cast<int64_t>(DTypeSize(b.dtype));
    }
    const bool whole =
        i + 1 == applies.size() || applies[i + 1].matrix != a.matrix;
    if (progress && whole && unsignaled >= kProgressBytes) {
      MUONPS_RETURN_IF_ERROR(trainer.buffers->SignalParameters(
          stream, staged.step_id,
          static_cast<uint32_t>(position[a.matrix] + 1)));
      unsignaled = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyUpdates(absl::Span<const ParamApply> applies,
                          const AttachedTrainer& trainer,
                          kernels::DeviceOps& ops, Stream stream) {
  const kernels::TypedBuffer& updates = trainer.updates;
  for (const ParamApply& a : applies) {
    const Binding& b = trainer.matrices[a.matrix];
    MUONPS_RETURN_IF_ERROR(
        ops.ApplyScaled(kernels::ElementsPast(b.param, b.dtype, a.first),
                        b.dtype, updates.at(a.staged_at), updates.dtype(),
                        a.count, a.decay, a.step, stream));
  }
  return absl::OkStatus();
}

namespace {

// Copies each of `applies`' parameter ranges to (`keep`) or from its place
// in `trainer.kept`.
absl::Status CopyKept(absl::Span<const ParamApply> applies,
                      const AttachedTrainer& trainer, kernels::DeviceOps& ops,
                      Stream stream, bool keep) {
  if (applies.empty()) return absl::OkStatus();
  if (trainer.kept == nullptr) {
    return absl::InternalError("no room kept for the parameters");
  }
  char* const kept = reinterpret_cast<char*>(trainer.kept->data());
  for (const ParamApply& a : applies) {
    const Binding& b = trainer.matrices[a.matrix];
    const int64_t width = static_cast<int64_t>(DTypeSize(b.dtype));
    void* param = kernels::ElementsPast(b.param, b.dtype, a.first);
    void* saved = kept + b.kept_at + a.first * width;
    MUONPS_RETURN_IF_ERROR(
        keep ? ops.CopyBytes(saved, param, a.count * width, stream)
             : ops.CopyBytes(param, saved, a.count * width, stream));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status KeepParameters(absl::Span<const ParamApply> applies,
                            const AttachedTrainer& trainer,
                            kernels::DeviceOps& ops, Stream stream) {
  return CopyKept(applies, trainer, ops, stream, /*keep=*/true);
}

absl::Status RestoreParameters(absl::Span<const ParamApply> applies,
                               const AttachedTrainer& trainer,
                               kernels::DeviceOps& ops, Stream stream) {
  return CopyKept(applies, trainer, ops, stream, /*keep=*/false);
}

absl::Status CommitStaged(StepLedger& ledger, PlanState& plan,
                          const AttachedTrainer* trainer,
                          kernels::DeviceOps& ops, int64_t release) {
  StagedStep& staged = ledger.staged;
  const Stream stream = ops.stream();
  if (staged.applied_mark >= 0) {
    // The peers' copies applied on the compute stream before the votes:
    // landed, since every writer voted yes once its copies were done.
    MUONPS_RETURN_IF_ERROR(ops.WaitForMark(stream, staged.applied_mark));
  }
  if (trainer != nullptr) {
    // The step record brackets the writes: a worker that dies part-way
    // leaves applying above applied for its successor to see.
    MUONPS_RETURN_IF_ERROR(trainer->buffers->WriteRecord(
        stream, StepRecordWord::kApplying, StepRecordValue(staged.step_id)));
    // The AdamW means first: the trainer's AdamW waits for them alone, and
    // its next forward for the parameters it reads, layer by layer.
    MUONPS_RETURN_IF_ERROR(WriteMeans(staged.means, *trainer, ops));
    if (release >= 0) {
      MUONPS_RETURN_IF_ERROR(
          trainer->buffers->SignalParameters(stream, staged.step_id, 0));
    }
    MUONPS_RETURN_IF_ERROR(
        WriteParameters(staged, *trainer, ops, /*progress=*/release >= 0));
    MUONPS_RETURN_IF_ERROR(trainer->buffers->WriteRecord(
        stream, StepRecordWord::kApplied, StepRecordValue(staged.step_id)));
    // The next forward needs only these writes: not the host's wait below,
    // nor the confirmations (the engine signals again after the round).
    if (release >= 0) {
      MUONPS_RETURN_IF_ERROR(trainer->buffers->SignalTrainer(stream, release));
    }
  }
  if (plan.momentum != nullptr) plan.momentum->CommitStaged();
  const int64_t step = staged.step_id;
  staged = StagedStep{};
  MUONPS_RETURN_IF_ERROR(ops.Synchronize(stream));
  ledger.last_version.store(plan.version);
  ledger.last.store(step);
  ledger.means_step = trainer != nullptr ? step : -1;
  return absl::OkStatus();
}

absl::Status RedeliverMeans(const StepLedger& ledger, int64_t step_id,
                            const AttachedTrainer& trainer,
                            kernels::DeviceOps& ops) {
  if (step_id != ledger.means_step) return absl::OkStatus();
  MUONPS_RETURN_IF_ERROR(WriteMeans(trainer.unreduced, trainer, ops));
  return ops.Synchronize(ops.stream());
}

void DropStaged(StepLedger& ledger, PlanState& plan) {
  ledger.staged = StagedStep{};
  if (plan.momentum != nullptr) plan.momentum->DropStaged();
}

CommitOutcome RunCommitPhases(
    int64_t step, const absl::Status& ready, ControlChannel& control, int rank,
    int size, const std::vector<std::string>& ids, StepLedger& ledger,
    PlanState& plan, const AttachedTrainer* trainer, kernels::DeviceOps& ops,
    const StepCancelled& cancelled, const StepHook& hook) {
  CommitOutcome out;
  absl::Status refusal = ready;
  // A step decided early was decided before the call could be cancelled.
  if (refusal.ok() && !ledger.staged.decided_early() && cancelled &&
      cancelled()) {
    refusal = absl::CancelledError(absl::StrCat(
        "step ", step,
        ": the trainer's Step call was cancelled or passed its deadline "
        "before the step committed; nothing was applied"));
  }
  StepVote vote{};
  vote.step_id = step;
  vote.yes = refusal.ok() ? 1 : 0;
  vote.code = static_cast<int32_t>(refusal.code());
  CopyProblem(std::string(refusal.message()), vote.reason);
  auto at = [&](StepPoint point) {
    if (hook) hook(point, step, rank);
  };
  // Phase one: the votes meet on rank 0, which decides.
  CommitDecision decision{};
  absl::Status told;
  if (rank != 0) {
    // Prepared before the vote leaves: once it may have arrived, rank 0
    // may commit, and this staging is what this rank then applies.
    ledger.staged.voted = vote.yes != 0;
    std::vector<StepVote> unused;
    absl::Status sent = control.Gather(vote, &unused);
    if (sent.ok()) at(StepPoint::kPrepared);
    // Passed on to this rank's children in the control tree once it
    // arrived: a rank that has it acts on it, as rank 0 does, even where
    // passing it on failed.
    bool arrived = false;
    if (sent.ok()) sent = control.Broadcast(&decision, 0, &arrived);
    if (!arrived || decision.step_id != step) {
      if (arrived) {
        sent = absl::InternalError(absl::StrCat(
            "rank 0 decided step ", decision.step_id, ", not ", step));
      }
      if (ledger.staged.voted) {
        out.status = InDoubt(step, sent);
      } else {
        DropStaged(ledger, plan);
        out.status = refusal.ok() ? sent : refusal;
      }
      return out;
    }
    told = sent;
  } else {
    std::string why =
        refusal.ok() ? "" : absl::StrCat(Who(ids, 0), ": ", refusal.message());
    absl::StatusCode code = refusal.code();
    // Every vote in one launch.
    std::vector<StepVote> votes;
    absl::Status heard = control.Gather(vote, &votes);
    if (!heard.ok()) {
      // Unheard: the step cannot commit. The peers that voted yes are in
      // doubt until a retry's round tells them this rank did not commit it.
      DropStaged(ledger, plan);
      out.status = Annotate(
          heard,
          absl::StrCat(
              "step ", step,
              " aborted before it committed (nothing was "
              "applied): ",
              size == 2 ? absl::StrCat("the vote of ", Who(ids, 1)) : "a vote",
              " did not arrive"));
      return out;
    }
    for (int r = 1; r < size; ++r) {
      const StepVote& theirs = votes[r];
      if (theirs.step_id != step) {
        DropStaged(ledger, plan);
        out.status = absl::InternalError(absl::StrCat(
            "step ", step,
            " aborted before it committed (nothing was applied): ", Who(ids, r),
            " voted on step ", theirs.step_id, ", not ", step));
        return out;
      }
      if (!theirs.yes && why.empty()) {
        why = absl::StrCat(Who(ids, r), ": ", ProblemText(theirs.reason));
        code = static_cast<absl::StatusCode>(theirs.code);
      }
    }
    at(StepPoint::kPrepared);
    decision.step_id = step;
    decision.commit = why.empty() ? 1 : 0;
    if (decision.commit && trainer != nullptr) {
      // Recorded before anyone hears it, in the trainer's memory: a
      // successor of this worker still knows the decision.
      // (Its instance is there already: it claimed the record when it
      // opened the step.)
      const absl::Status recorded = trainer->buffers->WriteRecord(
          ops.stream(), StepRecordWord::kDecided, StepRecordValue(step));
      if (!recorded.ok()) {
        decision.commit = 0;
        code = absl::StatusCode::kUnavailable;
        why =
            absl::StrCat("recording the decision failed: ", recorded.message());
      }
    }
    decision.code = static_cast<int32_t>(code);
    CopyProblem(why, decision.reason);
    told = control.Broadcast(&decision, 0);
  }
  if (!decision.commit || !vote.yes) {
    DropStaged(ledger, plan);
    out.transport_ok = told.ok();
    out.status =
        !refusal.ok()
            ? refusal
            : Aborted(step, static_cast<absl::StatusCode>(decision.code),
                      ProblemText(decision.reason));
    return out;
  }
  // Phase two: commit (rank 0 whether or not its decision reached every
  // rank: it made it), then confirm.
  out.decided = true;
  const absl::Status applied = CommitStaged(ledger, plan, trainer, ops, step);
  if (!applied.ok()) {
    out.status = absl::DataLossError(
        absl::StrCat("step ", step,
                     ": applying it failed part-way on this "
                     "worker: ",
                     applied.message()));
    return out;
  }
  out.committed = true;
  if (!told.ok()) {
    out.status = Unconfirmed(step, told);
    return out;
  }
  at(StepPoint::kCommitted);
  CommitConfirmation mine{step, 1, 0};
  absl::Status confirmed;
  std::vector<CommitConfirmation> confirmations;
  confirmed = control.Gather(mine, &confirmations);
  for (int r = 1; r < size && rank == 0 && confirmed.ok(); ++r) {
    const CommitConfirmation& theirs = confirmations[r];
    if (theirs.step_id != step || !theirs.done) {
      confirmed = absl::InternalError(
          absl::StrCat(Who(ids, r), " confirmed step ", theirs.step_id));
    }
  }
  CommitConfirmation all{};
  if (rank == 0) all = mine;
  if (confirmed.ok()) confirmed = control.Broadcast(&all, 0);
  if (confirmed.ok() && (all.step_id != step || !all.done)) {
    confirmed = absl::InternalError(
        absl::StrCat("rank 0 confirmed step ", all.step_id, ", not ", step));
  }
  if (!confirmed.ok()) {
    out.status = Unconfirmed(step, confirmed);
    return out;
  }
  ledger.settled = step;
  out.transport_ok = true;
  return out;
}

}  // namespace worker
}  // namespace muonps
