// The control messages of a step and the decisions taken on them: what every
// worker tells rank 0 when a round opens, how rank 0 settles staged steps
// and picks the step that runs, and the votes and confirmations of the
// commit (step_run.h describes the protocol as a whole). Plain data and pure
// functions: no transport, no device. Every struct is a multiple of 4 bytes,
// so it travels as floats through device memory too. Thread-compatible.
#ifndef MUONPS_SERVER_WORKER_STEP_PROTOCOL_H_
#define MUONPS_SERVER_WORKER_STEP_PROTOCOL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"
#include "server/worker/step_request.h"

namespace muonps {
namespace worker {

constexpr size_t kProblemBytes = 480;

// What every rank tells rank 0 when a round opens.
struct StepHeader {
  int64_t step_id;          // the trainer's request; -1: no trainer
  int64_t last_step;        // committed here (-1: none since it started)
  int64_t staged_step;      // staged and voted for, undecided here; -1: none
  uint64_t staged_decider;  // instance of the rank 0 that ran staged_step
  uint64_t instance;        // this worker process (random at start)
  uint64_t hyper_hash;      // HyperHash of the trainer's request
  uint64_t tensors_hash;    // TensorsHash of the trainer's AdamW bindings
  // Its trainer's staging window (WindowRecord::id; 0: none), and the
  // PeerWindows::Digest of the windows this rank last exchanged (0: none).
  uint64_t window;
  uint64_t windows_known;
  // StepLedger::round: the highest round it took part in (0: none).
  uint64_t last_round;
  // ScheduleDigest of the step schedule this rank computed for the plan
  // version: a step runs only when every rank's is the same.
  uint64_t schedule_digest;
  // What the trainer's step record (lending/step_record.h) held when it
  // attached, written by a worker before this one: a step whose writing
  // into the parameters stopped part-way (-1: none), and the highest step
  // that worker decided to commit as rank 0 (-1: none) with its instance.
  int64_t torn_step;
  int64_t record_decided;
  uint64_t record_decider;
  // What a repair from this rank could send (RoundKind::kRepair): the step
  // whose AdamW means its staging holds (-1: none), whether its trainer
  // keeps the whole parameter of every matrix, and whether it lends
  // unreduced AdamW tensors.
  int64_t means_step;
  // The step the trainer's parameters hold: last_step, or less for a
  // trainer that resumed from state saved before it (StepLedger::
  // trainer_behind).
  int64_t params_step;
  int32_t full_params;
  int32_t has_unreduced;
  // 1: this worker restarted, and its last step is what its trainer's step
  // record said (nothing committed here since): its momentum came from the
  // job's checkpoints or a handover, so a repair of its trainer's
  // parameters is all it needs. 0: a live worker that lacks a step dropped
  // the step's staging, momentum included.
  int32_t adopted;
  // The absl::StatusCode of `problem` (0: none): what the round's
  // rejection carries, so a trainer can tell a retry's case from a
  // request no retry fixes.
  int32_t problem_code;
  int32_t trainer_rank;  // -1: no trainer
  int32_t trainer_count;
  // The DType its updates travel in (PlanState::update_dtype): a step runs
  // only when every rank's is the same.
  int32_t update_dtype;
  char problem[kProblemBytes];  // "" or why this rank cannot step
};

// What rank 0 decides for a round.
enum class RoundKind : int32_t {
  // Every trainer asks for the same new step: it runs.
  kGo = 1,
  // No step runs: a rank whose trainer asked for a step at or below
  // `committed` answers already_applied; any other goes to a new round
  // (its peers' trainers come back with its step next).
  kNoStep = 2,
  // Refused on every rank with `code` and `problem`; nothing changed.
  kReject = 3,
  // The trainer of rank `target` misses step `committed`, which its
  // worker's predecessor did not apply (or applied part of): rank `source`,
  // whose trainer holds it, sends its trainer's parameters (and the step's
  // AdamW means) for the target to write into its trainer's (ParamRepair).
  // With `params` 0, only the means (the target's worker restarted after
  // applying the step, and its trainer retries it). Then as kNoStep; a
  // rank that still misses the step goes to a new round.
  kRepair = 4,
};

struct RoundDecision {
  int32_t kind;       // RoundKind
  int32_t code;       // absl::StatusCode of a rejection
  int64_t step_id;    // kGo: the step that runs
  int64_t committed;  // the highest step id committed on any rank
  // 1: every staged step at or below `committed` commits from its staging,
  // every other is dropped. 0: staging stays as it is (a kReject for
  // DATA_LOSS: the facts do not tell what to do).
  int32_t resolve;
  int32_t source;  // kRepair: the ranks that send and receive
  int32_t target;
  // kRepair: what the source sends. `params`: the trainer's parameter of
  // every job matrix (the target's miss the committed step, or hold part of
  // a step above it that nobody committed); `means`: the committed step's
  // AdamW means (the target's trainer retries that step).
  int32_t params;
  int32_t means;
  uint64_t decider;  // rank 0's instance
  char problem[kProblemBytes];
};

// Rank r -> rank 0 once its part of a step is staged: whether it may
// commit (voting yes makes the rank "prepared": from then on only the
// decision, or a later round's resolution, decides what its staging
// becomes).
struct StepVote {
  int64_t step_id;
  int32_t yes;
  int32_t code;  // absl::StatusCode why not
  char reason[kProblemBytes];
};

// Rank 0 -> every rank: commit (every vote was yes) or drop the staging.
struct CommitDecision {
  int64_t step_id;
  int32_t commit;
  int32_t code;  // absl::StatusCode of an abort
  char reason[kProblemBytes];
};

// Rank r -> rank 0 after committing; then rank 0 -> every rank once every
// rank has: the step is complete everywhere, a retry of it can be answered
// locally.
struct CommitConfirmation {
  int64_t step_id;
  int32_t done;
  int32_t padding;
};

// What rank 0 sends a worker with no trainer to open a round (that worker
// cannot know when its peers' trainers call Step).
struct RoundOpening {
  int64_t magic;
  int64_t padding;
};
constexpr int64_t kRoundOpeningMagic = 0x6d756f6e70730001;

static_assert(sizeof(StepHeader) % 4 == 0 && sizeof(RoundDecision) % 4 == 0 &&
                  sizeof(StepVote) % 4 == 0 &&
                  sizeof(CommitDecision) % 4 == 0 &&
                  sizeof(CommitConfirmation) % 4 == 0 &&
                  sizeof(RoundOpening) % 4 == 0,
              "control messages travel as floats");

// Copies `text` into a fixed problem field (cut, NUL-terminated).
void CopyProblem(const std::string& text, char* out);
// The text of a received problem field (which may lack its NUL).
std::string ProblemText(const char* field);

// A digest of a step's lr, weight decay, AdamW lr and every group's values
// (FNV-1a over their bytes): trainers that disagree about them would
// update their replicas differently, so the step is refused instead.
uint64_t HyperHash(const StepRequest& request);

// A digest of a step schedule: its order, every bucket's transfers and
// every stack with its chunks. Every worker must issue the same transfers
// in the same order, so workers whose builds cut the schedule differently
// (a rolling upgrade under way) must not step together. Computed once per
// plan version.
uint64_t ScheduleDigest(const scheduler::StepSchedule& schedule);

// One AdamW tensor as a trainer lends it.
struct AdamWTensorSpec {
  std::string name;
  int64_t elements = 0;
  bool unreduced = false;
  int group = -1;  // -1: none
};
// A digest of what a trainer attached: its AdamW tensors (names, sizes,
// layouts, groups) and the group of every job matrix (by matrix). The
// workers average unreduced tensors element by element and step every
// matrix with its group's values, so every trainer must attach the same.
// Computed once per attachment.
uint64_t TensorsHash(absl::Span<const AdamWTensorSpec> tensors,
                     absl::Span<const int> matrix_groups);

// Why `request` cannot run for a trainer that attached tensors in
// `group_count` groups, naming the field, or "": lr, weight_decay, adamw_lr
// and every group's values finite (negative: the default), and a value
// for every attached group unless `groups` is empty (then every tensor
// takes the step's own). O(groups): no per-tensor work.
std::string StepRequestProblem(const StepRequest& request, int group_count);

// Rank 0's decision for a round from every rank's header (by rank; the first
// `trainers` ranks have a trainer), `worker_ids` by rank for messages.
// Staged steps: one at or below the highest committed step anywhere commits
// (a rank commits only after its rank 0 decided to, so it was decided);
// one above it is dropped when the rank 0 that ran it is still here (it
// knows it did not commit), or when the step record its trainer lent says
// what that rank 0 decided before it restarted (a decision to commit counts
// as committed); otherwise the round is refused with DATA_LOSS. A trainer
// whose parameters miss the last committed step, or hold part of it (its
// worker restarted), and retry it is repaired (kRepair) from a trainer
// that holds it, when both keep whole parameters and the source still
// holds the step's AdamW means; so are the means alone for a retry on a
// worker that restarted after applying the step; otherwise DATA_LOSS names
// whose parameters miss what. So is a restarted worker that found no step
// record and retries a step its peers committed (whether its trainer's
// parameters hold it is unknown). Then a kNoStep if any trainer asks for a
// committed step, else a kGo once the requests, hyperparameters, AdamW tensors
// and trainer ranks agree (a kReject with INVALID_ARGUMENT naming the
// disagreement otherwise).
RoundDecision DecideRound(absl::Span<const StepHeader> headers, int trainers,
                          absl::Span<const std::string> worker_ids,
                          uint64_t decider);

// What a trainer must do when the job's state and its own parameters may
// differ: reload what it saved after the job's last committed step
// (`committed`; -1: none, so start again from the initial parameters).
std::string ReloadFrom(int64_t committed);

// Says that the parameters of `who`'s trainer (as Who names a worker) hold
// part of step `step`: the worker before stopped while writing them.
std::string TornParameters(const std::string& who, int64_t step);

// A kReject with `code` and `problem`; with `resolve`, staged steps at or
// below `committed` still commit and others are dropped.
RoundDecision Rejected(absl::StatusCode code, const std::string& problem,
                       int64_t committed, bool resolve);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_PROTOCOL_H_
