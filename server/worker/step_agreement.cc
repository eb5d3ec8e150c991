#include "server/worker/step_agreement.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {
namespace {

// What workers with no trainer learn from rank 0 before a step's
// transfers, as int64 values: the unreduced AdamW tensors' sizes (name
// order), then per job matrix whether its trainers keep the whole
// parameter of a row-sharded gradient (1) or not (0).
struct FollowerInfoHeader {
  int64_t adamw_count;
  int64_t matrix_count;
};

// What rank 0 broadcasts after its decision, as int32 values: each rank's
// trainer rank, each rank's window id (two values), then two flags: the
// windows changed since some rank last exchanged them (every rank
// exchanges them before the step's transfers), and some rank commits a
// staged step from its staging in Resolve (every rank waits for every
// other at its end: owners write the next step into the peers' staging
// only after that); then the round's number (two values), above every
// rank's StepHeader::last_round.
struct RoundRoster {
  std::vector<int32_t> trainer_rank_of;
  std::vector<uint64_t> windows;
  bool exchange = false;
  bool barrier = false;
  uint64_t round = 0;

  static size_t Ints(int size) { return 3 * static_cast<size_t>(size) + 4; }
  void Write(int32_t* out) const {
    const size_t size = trainer_rank_of.size();
    std::memcpy(out, trainer_rank_of.data(), size * sizeof(int32_t));
    std::memcpy(out + size, windows.data(), size * sizeof(uint64_t));
    out[3 * size] = exchange ? 1 : 0;
    out[3 * size + 1] = barrier ? 1 : 0;
    std::memcpy(out + 3 * size + 2, &round, sizeof(uint64_t));
  }
  void Read(const int32_t* in, int size) {
    trainer_rank_of.assign(in, in + size);
    windows.resize(size);
    std::memcpy(windows.data(), in + size, size * sizeof(uint64_t));
    exchange = in[3 * size] != 0;
    barrier = in[3 * size + 1] != 0;
    std::memcpy(&round, in + 3 * size + 2, sizeof(uint64_t));
  }
};

// The vote of a window exchange: this rank writes into every trainer's
// window.
struct WriterVote {
  int32_t writes;
  int32_t padding;
};

// What a barrier carries.
struct BarrierMark {
  int32_t here;
  int32_t padding;
};

}  // namespace

RoundAgreement::RoundAgreement(PlanState& plan, const AttachedTrainer* trainer,
                               StepLedger& ledger, ControlChannel& control,
                               kernels::DeviceOps& ops, StepCancelled cancelled)
    : plan_(plan),
      trainer_(trainer),
      ledger_(ledger),
      control_(control),
      ops_(ops),
      cancelled_(std::move(cancelled)),
      trainers_(plan.trainers()) {}

absl::Status RoundAgreement::LocalProblem(const StepRequest& request,
                                          const absl::Status& intact) {
  if (trainer_ == nullptr) return absl::OkStatus();
  if (!intact.ok()) return intact;
  // The trainer is gone or gave up; its retry (or its successor's) runs it.
  if (cancelled_ && cancelled_()) {
    return absl::AbortedError(
        "the trainer's Step call was cancelled or passed its deadline");
  }
  std::string problem = StepRequestProblem(request, trainer_->group_count);
  if (!problem.empty()) return absl::InvalidArgumentError(problem);
  return absl::OkStatus();
}

std::string RoundAgreement::ReplicaGroupProblem(
    absl::Span<const StepHeader> headers) const {
  const int replicas = plan_.job.replicas;
  if (replicas <= 1) return "";
  if (plan_.groups.count() != replicas) {
    return absl::StrCat(
        "plan version ", plan_.version, " has ", plan_.groups.count(),
        " owner group(s); a job of ", replicas,
        " replica groups (JobSpec.replicas) steps on a plan of one owner group "
        "per replica group, which the coordinator makes once every worker's "
        "heartbeat names its trainer; retry");
  }
  const int shards = trainers_ / replicas;
  for (size_t r = 0; r < headers.size(); ++r) {
    const int32_t trainer = headers[r].trainer_rank;
    if (trainer < 0) continue;
    const int32_t group = plan_.groups.group_of(static_cast<int32_t>(r));
    if (trainer / shards != group) {
      return absl::StrCat(
          "worker ", Quoted(plan_.ownership.worker_ids[r]), " serves trainer ",
          trainer, " of replica group ", trainer / shards,
          " but is in owner group ", group, " of plan version ", plan_.version,
          "; the coordinator plans again from the workers' heartbeats; retry");
    }
  }
  return "";
}

absl::Status RoundAgreement::Agree(const StepRequest& request,
                                   const absl::Status& intact,
                                   RoundDecision* decision) {
  const int size = static_cast<int>(plan_.ownership.worker_ids.size());
  StepHeader mine{};
  mine.step_id = trainer_ == nullptr ? -1 : request.step_id;
  mine.last_step = ledger_.last.load();
  mine.params_step = ledger_.params_step();
  mine.staged_step = ledger_.staged.voted ? ledger_.staged.step_id : -1;
  mine.staged_decider = ledger_.staged.decider;
  mine.instance = ledger_.instance;
  mine.hyper_hash = HyperHash(request);
  mine.trainer_rank = trainer_ == nullptr ? -1 : trainer_->rank;
  mine.trainer_count = trainer_ == nullptr ? 0 : trainer_->count;
  mine.update_dtype = static_cast<int32_t>(plan_.update_dtype);
  mine.window = trainer_ == nullptr ? 0 : trainer_->window.id;
  mine.windows_known = plan_.windows.known();
  mine.last_round = ledger_.round;
  mine.schedule_digest = plan_.schedule_digest;
  mine.torn_step = -1;
  mine.record_decided = -1;
  if (trainer_ != nullptr) {
    mine.tensors_hash = trainer_->tensors_hash;
    // What a worker before this one left in the trainer's step record.
    const StepRecord& inherited = trainer_->inherited;
    if (inherited.torn() > mine.last_step) mine.torn_step = inherited.torn();
    if (inherited.decider != ledger_.instance) {
      mine.record_decided = inherited.decided;
      mine.record_decider = inherited.decider;
    }
    // What a repair from here could send.
    mine.means_step = ledger_.means_step;
    mine.adopted =
        ledger_.last.load() >= 0 && ledger_.last_version.load() == 0 ? 1 : 0;
    mine.full_params = trainer_->full_params ? 1 : 0;
    mine.has_unreduced = trainer_->unreduced.empty() ? 0 : 1;
  }
  const absl::Status problem = LocalProblem(request, intact);
  mine.problem_code = static_cast<int32_t>(problem.code());
  CopyProblem(std::string(problem.message()), mine.problem);
  *decision = RoundDecision{};
  std::vector<StepHeader> headers;
  MUONPS_RETURN_IF_ERROR(OpenRound());
  if (plan_.rank == 0) {
    MUONPS_RETURN_IF_ERROR(control_.Gather(mine, &headers));
    *decision = DecideRound(headers, trainers_, plan_.ownership.worker_ids,
                            ledger_.instance);
    if (static_cast<RoundKind>(decision->kind) == RoundKind::kGo) {
      const std::string problem = ReplicaGroupProblem(headers);
      if (!problem.empty()) {
        const RoundDecision go = *decision;
        *decision =
            Rejected(absl::StatusCode::kUnavailable,
                     absl::StrCat("step ", go.step_id,
                                  " rejected, nothing was changed: ", problem),
                     go.committed, go.resolve != 0);
        decision->decider = go.decider;
      }
    }
    if (static_cast<RoundKind>(decision->kind) == RoundKind::kGo &&
        trainer_ != nullptr) {
      // Claimed before anyone stages the step: should this worker stop
      // before deciding it, its successor reads its instance with a
      // decision below the step, and the staged peers drop it.
      const absl::Status claimed = trainer_->buffers->WriteRecord(
          ops_.stream(), StepRecordWord::kDecider, ledger_.instance);
      if (!claimed.ok()) {
        const RoundDecision go = *decision;
        *decision = Rejected(
            absl::StatusCode::kUnavailable,
            absl::StrCat("step ", go.step_id,
                         " rejected, nothing was changed: recording rank 0 "
                         "in its trainer's step record failed: ",
                         claimed.message()),
            go.committed, go.resolve != 0);
        decision->decider = go.decider;
      }
    }
  } else {
    MUONPS_RETURN_IF_ERROR(control_.Gather(mine, &headers));
  }
  // The decision and the round's roster (RoundRoster) in one broadcast.
  static_assert(sizeof(RoundDecision) % sizeof(int32_t) == 0,
                "the roster follows the decision in whole int32s");
  constexpr size_t kDecisionInts = sizeof(RoundDecision) / sizeof(int32_t);
  std::vector<int32_t> told(kDecisionInts + RoundRoster::Ints(size), -1);
  RoundRoster round;
  if (plan_.rank == 0) {
    std::memcpy(told.data(), decision, sizeof(RoundDecision));
    for (const StepHeader& h : headers) {
      round.trainer_rank_of.push_back(h.trainer_rank);
      round.windows.push_back(h.window);
      round.round = std::max(round.round, h.last_round);
    }
    ++round.round;
    const uint64_t digest = PeerWindows::Digest(round.windows);
    for (const StepHeader& h : headers) {
      round.exchange = round.exchange || h.windows_known != digest;
      round.barrier =
          round.barrier || (decision->resolve != 0 && h.staged_step >= 0 &&
                            h.staged_step <= decision->committed);
    }
    round.Write(told.data() + kDecisionInts);
  }
  MUONPS_RETURN_IF_ERROR(
      control_.BroadcastBytes(told.data(), told.size() * sizeof(int32_t), 0));
  std::memcpy(decision, told.data(), sizeof(RoundDecision));
  round.Read(told.data() + kDecisionInts, size);
  barrier_ = round.barrier;
  ledger_.round = std::max(ledger_.round, round.round);
  if (static_cast<RoundKind>(decision->kind) != RoundKind::kGo) {
    return absl::OkStatus();
  }
  roster_.trainer_rank_of = round.trainer_rank_of;
  // Trainer order, then the ranks with no trainer (their parts are zeros,
  // added last: the sums keep the bits of the trainers' parts alone).
  roster_.reduce_order.assign(size, 0);
  for (int r = 0; r < size; ++r) {
    // A permutation once agreed (rank 0 checked it); clamp before that.
    const int32_t trainer = roster_.trainer_rank_of[r];
    if (trainer >= 0 && trainer < trainers_) roster_.reduce_order[trainer] = r;
    if (r >= trainers_) roster_.reduce_order[r] = r;
  }
  if (round.exchange) MUONPS_RETURN_IF_ERROR(ExchangeWindows(round.windows));
  if (plan_.ownership.dedicated > 0) {
    MUONPS_RETURN_IF_ERROR(ShareFollowerInfo());
  }
  return absl::OkStatus();
}

absl::Status RoundAgreement::OpenRound() {
  const RankTree& tree = control_.tree();
  if (trainer_ == nullptr && plan_.rank != 0) {
    const int parent = tree.Parent(plan_.rank);
    RoundOpening opening{};
    MUONPS_RETURN_IF_ERROR(control_.Recv(&opening, parent));
    if (opening.magic != kRoundOpeningMagic) {
      return absl::InternalError(
          absl::StrCat("rank ", parent, " opened a round with another wire"));
    }
  }
  for (const int child : tree.Children(plan_.rank)) {
    if (child < trainers_) continue;
    MUONPS_RETURN_IF_ERROR(
        control_.Send(RoundOpening{kRoundOpeningMagic, 0}, child));
  }
  return absl::OkStatus();
}

bool RoundAgreement::ResolveCommits(const RoundDecision& decision) const {
  const StagedStep& staged = ledger_.staged;
  return decision.resolve && staged.voted && staged.step_id >= 0 &&
         staged.step_id <= decision.committed;
}

absl::Status RoundAgreement::Resolve(const RoundDecision& decision) {
  if (!decision.resolve) return absl::OkStatus();
  StagedStep& staged = ledger_.staged;
  if (ResolveCommits(decision)) {
    // Some rank committed it: so does this one, from its staging.
    MUONPS_RETURN_IF_ERROR(CommitStaged(ledger_, plan_, trainer_, ops_));
  } else if (staged.step_id >= 0) {
    DropStaged(ledger_, plan_);
  }
  // Owners write the next step's updates into the peers' staging once
  // every rank has read its own.
  if (barrier_) MUONPS_RETURN_IF_ERROR(Barrier());
  // Answered here from now on, once this rank holds it (a rank whose
  // trainer misses it waits for a repair round).
  if (ledger_.last.load() >= decision.committed) {
    ledger_.settled = std::max(ledger_.settled, decision.committed);
  }
  return absl::OkStatus();
}

absl::Status RoundAgreement::ShareFollowerInfo() {
  FollowerInfoHeader header{};
  std::vector<int64_t> values;
  if (plan_.rank == 0) {
    for (const auto& [name, b] : trainer_->adamw) {
      if (b.layout == scheduler::Layout::kUnreduced) {
        values.push_back(b.elements);
      }
    }
    header.adamw_count = static_cast<int64_t>(values.size());
    header.matrix_count = static_cast<int64_t>(plan_.matrices.size());
    for (const Binding& b : trainer_->matrices) values.push_back(b.full_param);
  }
  MUONPS_RETURN_IF_ERROR(control_.Broadcast(&header, 0));
  if (header.matrix_count != static_cast<int64_t>(plan_.matrices.size()) ||
      header.adamw_count < 0 || header.adamw_count > (int64_t{1} << 24)) {
    return absl::InternalError("rank 0 described another job");
  }
  values.resize(header.adamw_count + header.matrix_count);
  MUONPS_RETURN_IF_ERROR(control_.BroadcastBytes(
      values.data(), values.size() * sizeof(int64_t), 0));
  if (trainer_ != nullptr) return absl::OkStatus();
  roster_.follower_adamw.assign(values.begin(),
                                values.begin() + header.adamw_count);
  roster_.follower_full_param.assign(values.begin() + header.adamw_count,
                                     values.end());
  return absl::OkStatus();
}

absl::Status RoundAgreement::ExchangeWindows(absl::Span<const uint64_t> ids) {
  const int size = static_cast<int>(ids.size());
  const WindowRecord mine =
      trainer_ == nullptr ? WindowRecord{} : trainer_->window;
  std::vector<WindowRecord> records;
  MUONPS_RETURN_IF_ERROR(control_.Gather(mine, &records));
  records.resize(size);
  MUONPS_RETURN_IF_ERROR(control_.BroadcastBytes(
      records.data(), records.size() * sizeof(WindowRecord), 0));
  for (int r = 0; r < size; ++r) {
    if (records[r].id != ids[r]) {
      return absl::InternalError(
          absl::StrCat("rank ", r, " described another staging window"));
    }
  }
  // An owner writes into the trainers of its own owner group.
  std::vector<int> targets;
  for (const int r : plan_.group_members) {
    if (roster_.trainer_rank_of[r] >= 0) targets.push_back(r);
  }
  const bool writes =
      plan_.windows.Open(records, plan_.rank, targets, plan_.lender);
  std::vector<WriterVote> votes;
  MUONPS_RETURN_IF_ERROR(
      control_.Gather(WriterVote{writes ? 1 : 0, 0}, &votes));
  std::vector<int32_t> writers(size, 0);
  if (plan_.rank == 0) {
    for (int r = 0; r < size; ++r) writers[r] = votes[r].writes;
  }
  MUONPS_RETURN_IF_ERROR(control_.BroadcastBytes(
      writers.data(), writers.size() * sizeof(int32_t), 0));
  int writing = 0;
  for (const int32_t w : writers) writing += w != 0 ? 1 : 0;
  spdlog::info(
      "plan version {} rank {}: {} of {} workers write updates into the "
      "trainers' staging (peer writes); the others' go by the transport",
      plan_.version, plan_.rank, writing, size);
  plan_.windows.SetWriters(std::move(writers), PeerWindows::Digest(ids));
  return absl::OkStatus();
}

absl::Status RoundAgreement::Barrier() {
  std::vector<BarrierMark> marks;
  MUONPS_RETURN_IF_ERROR(control_.Gather(BarrierMark{1, 0}, &marks));
  BarrierMark done{1, 0};
  return control_.Broadcast(&done, 0);
}

}  // namespace worker
}  // namespace muonps
