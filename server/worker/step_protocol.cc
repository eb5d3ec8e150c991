#include "server/worker/step_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"
#include "server/worker/digest.h"

namespace muonps {
namespace worker {
namespace {

std::string Who(absl::Span<const std::string> ids, int rank) {
  return rank >= 0 && rank < static_cast<int>(ids.size())
             ? absl::StrCat("worker ", Quoted(ids[rank]))
             : absl::StrCat("rank ", rank);
}

// Why trainer rank `r`'s header shows a plan still forming, or "".
std::string PlanForming(const StepHeader& x, int r, int trainers,
                        absl::Span<const std::string> ids) {
  if (x.trainer_rank < 0) {
    return absl::StrCat(Who(ids, r),
                        " has no trainer attached, and every worker of the "
                        "plan's first ",
                        trainers,
                        " ranks needs one: retry once its trainer attaches, "
                        "or once a worker with no trainer has left the job");
  }
  if (x.trainer_count != trainers) {
    return absl::StrCat(
        "the plan has ", trainers, " workers for trainers, but ", Who(ids, r),
        "'s trainer is ", x.trainer_rank, " of ", x.trainer_count,
        ": a worker is leaving or joining the job; retry once the plan has "
        "one worker per trainer");
  }
  return "";
}

}  // namespace

std::string ReloadFrom(int64_t committed) {
  if (committed < 0) {
    return "no step was committed: start every trainer again from its "
           "initial parameters and first step";
  }
  return absl::StrCat(
      "reload every trainer's parameters and optimizer state saved after "
      "step ",
      committed,
      " (the workers' momentum: the job's checkpoint of "
      "that step) and go on with step ",
      committed + 1);
}

std::string TornParameters(const std::string& who, int64_t step) {
  return absl::StrCat("the parameters of ", who,
                      "'s trainer hold part of step ", step,
                      " (the worker before it stopped while writing them)");
}

RoundDecision Rejected(absl::StatusCode code, const std::string& problem,
                       int64_t committed, bool resolve) {
  RoundDecision d{};
  d.kind = static_cast<int32_t>(RoundKind::kReject);
  d.code = static_cast<int32_t>(code);
  d.step_id = -1;
  d.committed = committed;
  d.resolve = resolve ? 1 : 0;
  CopyProblem(problem, d.problem);
  return d;
}

void CopyProblem(const std::string& text, char* out) {
  std::memset(out, 0, kProblemBytes);
  std::memcpy(out, text.data(), std::min(text.size(), kProblemBytes - 1));
}

std::string ProblemText(const char* field) {
  return std::string(field, strnlen(field, kProblemBytes));
}

uint64_t HyperHash(const StepRequest& r) {
  Digest d;
  d.Mix(r.lr);
  d.Mix(r.weight_decay);
  d.Mix(r.adamw_lr);
  for (const GroupHyperparameters& g : r.groups) {
    d.Mix(g.lr);
    d.Mix(g.weight_decay);
    d.Mix(g.adamw_lr);
    d.Mix(g.adamw_weight_decay);
  }
  d.Mix(static_cast<int64_t>(r.groups.size()));
  return d.value();
}

uint64_t TensorsHash(absl::Span<const AdamWTensorSpec> tensors,
                     absl::Span<const int> matrix_groups) {
  Digest d;
  for (const AdamWTensorSpec& t : tensors) {
    d.Mix(t.name);
    d.Mix(t.elements);
    d.Mix(static_cast<int64_t>(t.unreduced));
    d.Mix(static_cast<int64_t>(t.group));
  }
  d.Mix("|", 1);
  for (const int group : matrix_groups) d.Mix(static_cast<int64_t>(group));
  return d.value();
}

uint64_t ScheduleDigest(const scheduler::StepSchedule& schedule) {
  Digest d;
  const auto mix_item = [&d](const scheduler::ItemRef& item) {
    d.Mix(static_cast<int64_t>(item.matrix));
    d.Mix(static_cast<int64_t>(item.expert));
  };
  for (const scheduler::Phase& phase : schedule.order) {
    d.Mix(static_cast<int64_t>(phase.kind));
    d.Mix(static_cast<int64_t>(phase.index));
  }
  d.Mix("|", 1);
  for (const scheduler::Bucket& bucket : schedule.buckets) {
    for (const int32_t m : bucket.matrices) d.Mix(static_cast<int64_t>(m));
    for (const auto* transfers : {&bucket.to_owners, &bucket.from_owners}) {
      d.Mix("|", 1);
      for (const scheduler::Transfer& t : *transfers) {
        d.Mix(static_cast<int64_t>(t.kind));
        mix_item(t.item);
        d.Mix(static_cast<int64_t>(t.owner));
        d.Mix(t.bytes);
        d.Mix(static_cast<int64_t>(t.group));
        // Only where set: schedules without it digest as before.
        if (t.by_collective) d.Mix("c", 1);
      }
    }
    d.Mix("/", 1);
  }
  for (const scheduler::OwnerStack& stack : schedule.stacks) {
    d.Mix(static_cast<int64_t>(stack.owner));
    d.Mix(stack.rows);
    d.Mix(stack.cols);
    d.Mix(static_cast<int64_t>(stack.ready_bucket));
    for (const scheduler::ItemRef& item : stack.items) mix_item(item);
    d.Mix("|", 1);
    for (const scheduler::StackChunk& chunk : stack.chunks) {
      d.Mix(chunk.count);
      d.Mix(static_cast<int64_t>(chunk.algorithm));
    }
    d.Mix("/", 1);
  }
  for (const std::vector<int32_t>& group : schedule.groups) {
    for (const int32_t w : group) d.Mix(static_cast<int64_t>(w));
    d.Mix("/", 1);
  }
  return d.value();
}

std::string StepRequestProblem(const StepRequest& r, int group_count) {
  // Negative values select the default, but not -Inf (nor NaN).
  for (const auto& [field, value] : {std::pair<const char*, double>{"lr", r.lr},
                                     {"weight_decay", r.weight_decay},
                                     {"adamw_lr", r.adamw_lr}}) {
    if (!std::isfinite(value)) {
      return absl::StrCat(field, ": ", value,
                          " is not finite (a negative value keeps the "
                          "default)");
    }
  }
  const int given = static_cast<int>(r.groups.size());
  for (int i = 0; i < given; ++i) {
    const GroupHyperparameters& g = r.groups[i];
    for (const auto& [field, value] :
         {std::pair<const char*, double>{"lr", g.lr},
          {"weight_decay", g.weight_decay},
          {"adamw_lr", g.adamw_lr},
          {"adamw_weight_decay", g.adamw_weight_decay}}) {
      if (!std::isfinite(value)) {
        return absl::StrCat("groups[", i, "].", field, ": ", value,
                            " is not finite (a negative value keeps the "
                            "step's)");
      }
    }
  }
  if (given > 0 && given < group_count) {
    return absl::StrCat("groups: ", given,
                        " entries; the trainer attached tensors in ",
                        group_count, " groups");
  }
  return "";
}

RoundDecision DecideRound(absl::Span<const StepHeader> h, int trainers,
                          absl::Span<const std::string> ids, uint64_t decider) {
  const int n = static_cast<int>(h.size());
  int64_t committed = -1;
  int committer = 0;
  for (int r = 0; r < n; ++r) {
    if (h[r].last_step > committed) {
      committed = h[r].last_step;
      committer = r;
    }
  }
  // A rank 0 that decided to commit and then restarted: its decision
  // stands (some rank may have committed on it), as its trainer's step
  // record says.
  for (int r = 0; r < n; ++r) {
    if (h[r].record_decided > committed) {
      committed = h[r].record_decided;
      committer = r;
    }
  }
  // A plan still forming: a trainer's rank whose worker has no trainer
  // attached (it restarted, and its trainer attaches again) or whose
  // trainer counts another number of trainers (a worker joining or
  // leaving). Nothing is decided before every trainer's worker speaks for
  // its trainer (and its step record): a retry once it does.
  for (int r = 0; r < trainers && r < n; ++r) {
    const std::string forming = PlanForming(h[r], r, trainers, ids);
    if (!forming.empty()) {
      return Rejected(absl::StatusCode::kUnavailable,
                      absl::StrCat("step ", h[0].step_id,
                                   " rejected, nothing was changed: ", forming),
                      committed, false);
    }
  }
  // Staged steps: commit, drop, or nobody can tell.
  for (int r = 0; r < n; ++r) {
    const int64_t staged = h[r].staged_step;
    if (staged < 0 || staged == committed) continue;
    if (staged < committed) {
      return Rejected(
          absl::StatusCode::kDataLoss,
          absl::StrCat(Who(ids, r), " holds step ", staged,
                       " staged, but step ", committed,
                       " was committed since: ", ReloadFrom(committed)),
          committed, false);
    }
    // The rank 0 that ran it is here, or its decisions are: the step
    // record its trainer lent says the highest step it decided to commit,
    // and this one is above it (an abort is not recorded: nobody committed).
    bool decider_here = false;
    for (int q = 0; q < n; ++q) {
      decider_here = decider_here || h[q].instance == h[r].staged_decider ||
                     (h[q].record_decider != 0 &&
                      h[q].record_decider == h[r].staged_decider);
    }
    if (!decider_here) {
      return Rejected(
          absl::StatusCode::kDataLoss,
          absl::StrCat(Who(ids, r), " holds step ", staged,
                       " staged, and the worker that decided it restarted: "
                       "whether that worker's trainer applied it is unknown; ",
                       ReloadFrom(committed)),
          committed, false);
    }
  }
  // Trainers whose parameters miss the last committed step (their
  // worker's predecessor stopped before applying it, or part-way; or they
  // resumed from state saved before it), or hold part of a step above it
  // that nobody committed (applied before the votes, EarlyApply, and their
  // worker killed before it could put them back: the peers put theirs
  // back, so their trainers hold the committed step whole).
  for (int r = 0; r < trainers && r < n; ++r) {
    const bool torn = h[r].torn_step >= 0;
    const bool uncommitted = torn && h[r].torn_step > committed;
    const bool fresh = h[r].last_step < 0 && h[r].staged_step < 0 && !torn;
    const bool resumed = h[r].params_step < h[r].last_step;
    const bool misses = !(fresh || h[r].staged_step == committed ||
                          (h[r].params_step >= committed && !torn));
    // A retry of the step, answered already_applied, on a worker that no
    // longer holds the step's AdamW means (it restarted): the lent
    // gradients may be the trainer's own again, so the means come from a
    // peer too.
    const bool needs_means =
        !misses && !fresh && h[r].has_unreduced && h[r].step_id == committed &&
        h[r].means_step != committed && h[r].staged_step != committed;
    if (!misses && !needs_means) continue;
    // A trainer that misses the committed step retries it (answered
    // already_applied, it steps AdamW on the means); one that holds part of
    // a later step has stepped AdamW on the committed one already.
    const bool means = !uncommitted;
    std::string why_not;
    if (!misses) {
      // Only the means.
    } else if (uncommitted) {
      if (h[r].params_step != committed) {
        why_not =
            absl::StrCat("under step ", h[r].torn_step, " they hold step ",
                         h[r].params_step, ", more than one step behind");
      }
    } else if (h[r].params_step != committed - 1 ||
               (torn && h[r].torn_step != committed)) {
      why_not = absl::StrCat("they hold step ", h[r].params_step,
                             ", more than one step behind");
    } else if (!torn && !h[r].adopted && !resumed) {
      why_not =
          "its worker dropped the step it had staged (a plan changed "
          "meanwhile), and with it that step's momentum";
    } else if (h[r].step_id != committed) {
      why_not = absl::StrCat("its trainer asks for step ", h[r].step_id);
    }
    if (why_not.empty() && misses && !h[r].full_params) {
      why_not = "its trainer keeps only its rows of a row-sharded matrix";
    }
    int source = -1;
    for (int s = 0; s < trainers && s < n && why_not.empty(); ++s) {
      const bool holds = h[s].torn_step < 0 && (h[s].params_step == committed ||
                                                h[s].staged_step == committed);
      const bool has_means = !means || !h[s].has_unreduced ||
                             h[s].means_step == committed ||
                             h[s].staged_step == committed;
      if (s != r && holds && has_means && (!misses || h[s].full_params) &&
          h[s].tensors_hash == h[r].tensors_hash) {
        source = s;
        break;
      }
    }
    if (why_not.empty() && source < 0) {
      why_not = absl::StrCat("no trainer that holds step ", committed,
                             misses ? " keeps whole parameters" : "",
                             misses && means ? " and" : "",
                             means ? " holds that step's AdamW means" : "");
    }
    if (!why_not.empty()) {
      const std::string what =
          !misses ? absl::StrCat(Who(ids, r),
                                 " restarted and its trainer "
                                 "retries step ",
                                 committed,
                                 ", whose AdamW means it no longer holds")
          : uncommitted
              ? absl::StrCat(TornParameters(Who(ids, r), h[r].torn_step),
                             "; step ", h[r].torn_step, " was never committed")
          : torn ? TornParameters(Who(ids, r), h[r].torn_step)
          : resumed
              ? absl::StrCat(Who(ids, r),
                             "'s trainer resumed from state saved after step ",
                             h[r].params_step, ", and ", Who(ids, committer),
                             " committed step ", committed)
              : absl::StrCat(Who(ids, r), " lost step ", committed, ", which ",
                             Who(ids, committer),
                             " committed: its trainer's parameters "
                             "lack it");
      return Rejected(absl::StatusCode::kDataLoss,
                      absl::StrCat(what, "; no repair: ", why_not, "; ",
                                   ReloadFrom(committed)),
                      committed, false);
    }
    RoundDecision d{};
    d.kind = static_cast<int32_t>(RoundKind::kRepair);
    d.step_id = committed;
    d.committed = committed;
    d.resolve = 1;
    d.source = source;
    d.target = r;
    d.params = misses ? 1 : 0;
    d.means = means ? 1 : 0;
    d.decider = decider;
    return d;
  }
  bool settled = false, asking = false;
  for (int r = 0; r < trainers && r < n; ++r) {
    const bool fresh = h[r].last_step < 0 && h[r].staged_step < 0;
    if (committed >= 0 && fresh && h[r].step_id <= committed) {
      return Rejected(
          absl::StatusCode::kDataLoss,
          absl::StrCat(Who(ids, r), " restarted and its trainer retries step ",
                       h[r].step_id, ", which ", Who(ids, committer),
                       " committed (up to step ", committed,
                       "): whether that trainer's parameters hold it is "
                       "unknown; ",
                       ReloadFrom(committed)),
          committed, false);
    }
    if (h[r].step_id <= committed) {
      settled = true;
    } else {
      asking = true;
    }
  }
  RoundDecision d{};
  d.committed = committed;
  d.resolve = 1;
  d.decider = decider;
  d.step_id = -1;
  if (settled || !asking) {
    d.kind = static_cast<int32_t>(RoundKind::kNoStep);
    return d;
  }
  // Every trainer asks for a new step: the same one, the same way?
  const StepHeader& first = h[0];
  std::vector<bool> seen(trainers, false);
  std::string problem;
  // What no retry fixes (a plan still forming was answered above), unless
  // a rank's own problem says otherwise (a cancelled call: ABORTED).
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  for (int r = 0; r < trainers && r < n && problem.empty(); ++r) {
    const StepHeader& x = h[r];
    if (x.problem[0] != 0) {
      problem = absl::StrCat(Who(ids, r), ": ", ProblemText(x.problem));
      if (x.problem_code != 0) {
        code = static_cast<absl::StatusCode>(x.problem_code);
      }
    } else if (x.step_id != first.step_id) {
      problem = absl::StrCat(Who(ids, r), " is at step ", x.step_id, ", ",
                             Who(ids, 0), " at ", first.step_id);
    } else if (x.hyper_hash != first.hyper_hash) {
      problem =
          absl::StrCat("the trainers of ", Who(ids, r), " and ", Who(ids, 0),
                       " step with different lr, weight_decay, "
                       "adamw_lr or param group values");
    } else if (x.tensors_hash != first.tensors_hash) {
      problem =
          absl::StrCat("the trainers of ", Who(ids, r), " and ", Who(ids, 0),
                       " lend different AdamW tensors (names, sizes "
                       "or layouts) or parameter groups");
    } else if (x.trainer_rank >= trainers || seen[x.trainer_rank]) {
      problem = absl::StrCat(
          "every worker with a trainer needs exactly one trainer of ", trainers,
          "; ", Who(ids, r), " has trainer ", x.trainer_rank, " of ",
          x.trainer_count);
    } else {
      seen[x.trainer_rank] = true;
    }
  }
  for (int r = 1; r < n && problem.empty(); ++r) {
    if (h[r].update_dtype != first.update_dtype) {
      problem = absl::StrCat(
          Who(ids, r), " moves its updates in ",
          DTypeName(static_cast<DType>(h[r].update_dtype)), " and ",
          Who(ids, 0), " in ",
          DTypeName(static_cast<DType>(first.update_dtype)),
          ": every worker of a job runs Newton-Schulz in one precision "
          "(--precision)");
      code = absl::StatusCode::kFailedPrecondition;
    } else if (h[r].schedule_digest != first.schedule_digest) {
      // Retried: once every worker runs one build, the steps go on.
      problem = absl::StrCat(
          Who(ids, r), " and ", Who(ids, 0),
          " cut this plan version's step schedule differently (their builds "
          "differ, as while a rolling upgrade is under way): the workers "
          "must issue the same transfers in the same order; retry once every "
          "worker of the job runs one build");
      code = absl::StatusCode::kUnavailable;
    }
  }
  if (!problem.empty()) {
    RoundDecision rejected =
        Rejected(code,
                 absl::StrCat("step ", first.step_id,
                              " rejected, nothing was changed: ", problem),
                 committed, true);
    rejected.decider = decider;
    return rejected;
  }
  // A staged step this round drops that another rank 0 ran: the drop
  // happens first, in a round of its own. The rank 0 that opens a step
  // claims its trainer's step record before anyone hears of the step
  // (StepRecordWord::kDecider), and the record must still name that other
  // rank 0 until nobody holds its step.
  for (int r = 0; r < n; ++r) {
    if (h[r].staged_step > committed && h[r].staged_decider != decider) {
      d.kind = static_cast<int32_t>(RoundKind::kNoStep);
      return d;
    }
  }
  d.kind = static_cast<int32_t>(RoundKind::kGo);
  d.step_id = first.step_id;
  return d;
}

}  // namespace worker
}  // namespace muonps
