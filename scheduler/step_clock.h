// A predicted clock for one step of a plan's schedule on a known network:
// which node each worker is on and how fast the links within and between
// nodes are. The planner's coordinator uses it to choose how transfers are
// grouped (StepGrouping below); bench/scale_sim uses it to predict steps on
// 1..1024 GPUs. Only time is modelled; the plan and the schedule are the
// real ones.
//
// The model follows what a worker does (server/worker/step_run.cc):
// - Two streams per worker. Every phase that moves data (a bucket's
//   gradients to owners, or its updates back) is one grouped launch among
//   all workers (with exchange nodes, the exchange's launches, pipelined
//   with the phases beside it: see below), issued in the same order on
//   every rank, so it starts on every worker at once (when the last rank
//   reaches it) and ends at once: the transfer streams form one global
//   timeline.
// - Owner groups (OwnershipPlan::groups, StepSchedule::groups): each group
//   owns every matrix among its own members, and each of its transfers
//   (Transfer::group) runs among them only. A phase holds every group's
//   transfers of its bucket; the groups' parts run at once on disjoint
//   links (each member's NVLink and NIC), so the phase takes as long as
//   its slowest group's part. Groups hold copies of one plan, so their
//   parts match and one timeline still stands for all of them. Without
//   groups: one group of every worker.
// - Every bucket's gradients-to-owners phase is issued first, in the
//   schedule's order, back to back from time 0 (gradients are all ready
//   when the step starts, after backward). A bucket's gradients have
//   landed when its phase ends (with exchange nodes, its last launch; a
//   bucket without such transfers: when the previous one's did; none at
//   all, as with replicated gradients: at 0).
// - A stack's momentum + Newton-Schulz runs on its owner's compute stream
//   in the schedule's order, once the bucket that completes it
//   (OwnerStack::ready_bucket) has landed. Compute never waits for updates
//   going back, nor for other workers. While a transfer phase is in
//   flight, a worker's compute runs 1 + `transfer_contention` times slower
//   (NCCL's kernels hold SMs and their copies HBM bandwidth).
// - The updates-back phases follow on the transfer stream, after all the
//   gradients. Before each, every worker's transfer stream waits for all
//   compute that worker has issued so far; the collective starts when the
//   last rank gets there: at max(previous phase's end, every worker's
//   compute so far).
// - The step begins with the agreement (AgreementSeconds): every transfer
//   and every stack waits for it, but one. A worker whose trainer holds
//   every gradient of its first stack in the schedule's order (all its
//   items replicated, none sent to it: it has a trainer) computes that
//   stack from time 0, while the ranks agree (StepStaging::ComputeAhead,
//   as a step after the last one under the same plan does).
// - The stage ends when the last update has landed and every compute
//   stream is done. Then the commit: the vote (VoteSeconds) plus
//   applying the staged updates to the trainer's fp32 parameters, memory bound
//   at 8 bytes of parameter read and written plus the update's bytes per
//   parameter the worker's trainer holds (all of them; 1/N of a row-sharded
//   matrix's rows) over `hbm_bytes_per_second`; or, where that is faster
//   and ClockSettings::apply_early lets it, only what is left after the
//   stage of the applies before the votes.
// - Peer writes (server/worker/staging_windows.h): within an owner group
//   whose workers are all on one node (without groups: every worker on one
//   node), when every trainer keeps every parameter whole, an owner copies
//   each update into every other member's trainer staging with the copy
//   engines: its updates-back phases run on its own transfer stream, each
//   after the owner's compute issued before it, at `copy_engine_gbs` per
//   owner (its n-1 copies one after another, n the group's members), and
//   slow no compute. The updates of each owner's last stack in a group of
//   more than two (Transfer::by_collective) go by collective instead, as
//   below. So groups of one node each (ChooseOwnerGroupings) send
//   no update over a NIC: each node's step is the step of its workers
//   alone.
//
// Phase time = the slowest group's message latency + ring fill + bandwidth
// term, with n the group's members (every worker without groups):
// - each collective or point-to-point batch of the group's part costs
//   `latency_us`; a part with a ring collective (reduce, broadcast) pays
//   `hop_latency_us` per hop of the n-1 hop ring once.
// - bytes on the wire are `wire_bytes_per_element` per gradient element
//   and `update_bytes_per_element` per update element. A reduce or
//   broadcast moves the matrix's S bytes through every member (ring):
//   within one node over NVLink; across nodes S (G-1)/G over NVLink and
//   S/G over each GPU's NIC, G the most members on one node. A row gather
//   moves S/n from each member to the owner, a row scatter the reverse
//   (a whole expert of a stack sharded on its experts: S from the member
//   whose trainer holds it, ClockSettings::trainer_shards, and nothing
//   where that member owns it); parts between nodes go over the NICs.
//   With exchange nodes, the rows of a matrix sharded by rows go through
//   relays (RelaysRows, node_exchange.h): a member on the owner's node or
//   at the owner's position sends straight; another sends its S/n to the
//   relay at its position on the owner's node, and the relays pass them
//   on in a second launch after the phase's (one latency_us, and its
//   busiest rank's seconds over the link each pass crosses); a scatter
//   the reverse.
//   The part's bandwidth term is its slowest member's
//   max(NVLink bytes / nvlink rate, NIC bytes / NIC rate), bytes per rank
//   the larger of sent and received.
//
// Exchange nodes (StepSchedule::exchange_nodes: M nodes of G workers, no
// owner groups): a bucket's unreduced gradients and their updates move by
// the exchange (node_exchange.h) instead of a reduce and a broadcast per
// matrix over every rank: within each node, and across the nodes along
// the rails (rail p: the workers at position p of every node), whose rings
// have M members. With S the bytes of the bucket's exchanged items packed
// and padded, cut into G blocks of S/G (E elements unpadded, E' padded, b
// bytes each: wire_bytes_per_element for gradients,
// update_bytes_per_element for updates), each way the bucket's exchange is
// L = [G > 1] + [M > 1] + [G > 1] dependent steps, one a launch. For
// gradients:
// 1. within each node (where G > 1): the worker at position p receives
//    block p from the node's G - 1 other workers, each member sending and
//    receiving S (G-1)/G over NVLink (/ nvlink_gbs; no reduce_gbs: the
//    adds are their own, in HBM, below);
// 2. along the rails (where M > 1): each item's part of block p is reduced
//    by a ring over rail p onto the worker at position p of the item's
//    owner's node, adding as it moves (no adds in HBM). The ring moves the
//    block through every member: S/G sent and received over each NIC
//    (/ inter_node_gbs, as a flat ring's NIC share; a rail laid within one
//    host: over NVLink, / reduce_gbs as a ring reduce's), and its launch
//    fills M - 1 hops;
// 3. within the owner's node (where G > 1): each item's part in each block
//    from the worker at the block's position to the owner (none from its
//    own block), over NVLink, timed by its busiest rank as a row gather is.
// Updates take the reverse steps: the parts from the owner to the positions
// of its node (its busiest rank), a ring broadcast along each rail from the
// worker at that position on the owner's node to every node (S/G over each
// NIC, M - 1 hops), then every block to the node's other positions (S
// (G-1)/G each way over NVLink). So each element of a matrix crosses the
// network once each way, spread over the G ports of every node as a flat
// ring's bytes are, and no ring fills more than M - 1 hops. HBM, at
// hbm_bytes_per_second, runs on the transfer stream around the launches:
// the items copied into the pack before the first step (gradients) or out
// of it after the last (updates), 2 E b bytes; and after the gradients'
// step within the nodes, its adds, two fp32 reads and a write (12 bytes)
// for each element received: (E'/G) (G-1).
// The exchange is pipelined over each sequence of phases issued back to
// back (every gradients-to-owners phase; each run of consecutive
// updates-back phases in the schedule's order). The j-th phase of
// a sequence that moves something (from 0) takes its step k in launch
// j + k, and its other transfers go in launch j, with its step 0 (a phase
// without the exchange is that one launch). Launch t lasts
//   its other transfers' latency (as above) + latency_us
//   + h hop_latency_us + max(NVLink seconds, NIC seconds)
//   + its steps' HBM seconds,
// h the most hops of its steps (M - 1 for a rail's, 1 for the others), the
// seconds on a link being its other transfers' (their slowest group's
// busiest rank's, as above) and its steps' on that link added up: one
// latency a launch, however many buckets' steps it holds; different links
// overlap, one link's steps take turns. A launch without a step is the
// phase of its other transfers, timed as above. So B phases of L steps take
// B + L - 1 launches; a phase has landed (its gradients, for the compute
// waiting on them; its updates) when its last launch ends (a phase that
// moves nothing: with the one before it, or at the sequence's start).
// A step laid across hosts (exchange nodes that are not the topology's)
// is clocked over the NICs. Towards bytes_per_gpu every member moves the
// levels' bytes within the nodes and along the rails (as a ring's bytes),
// and the ranks of the parts within the owners' nodes theirs.
//
// Functions are thread-safe (they share no state).
#ifndef MUONPS_SCHEDULER_STEP_CLOCK_H_
#define MUONPS_SCHEDULER_STEP_CLOCK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/cost_model.h"
#include "scheduler/plan_types.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace scheduler {

// Link figures per GPU, per direction. Defaults: NVLink is the NCCL
// all-to-all bus bandwidth measured among 4 H200s; the NIC is one 400 Gb/s
// port per GPU (not measured); latencies are NCCL's tuning model for
// ring/Simple (not measured).
struct LinkFigures {
  double nvlink_gbs = 300;      // among the GPUs of one node
  double inter_node_gbs = 50;   // each GPU's network port
  double latency_us = 8.4;      // per collective or point-to-point batch
  double hop_latency_us = 3.4;  // per ring hop, once per phase
  // NVLink rate of a reduce's ring (NCCL also sums on the way); 0: the
  // same as nvlink_gbs.
  double reduce_gbs = 0;
  // One stream of peer copies (copy engines) into another GPU of the node:
  // 198 GB/s for bf16 updates on 2 H200s
  // (bench/results/2026-11-29-h200x2-transfer-paths.jsonl, peer_copy).
  double copy_engine_gbs = 198;
};

// Where the workers of a plan are and how they are linked.
struct Topology {
  // node[r]: the node (host) of rank r, numbered from 0. Empty: one node.
  std::vector<int32_t> node;
  LinkFigures links;

  // `workers` ranks, `per_node` consecutive ranks on each node.
  static Topology Blocks(int workers, int per_node);
  // Distinct nodes (at least 1).
  int nodes() const;
  // The most ranks on one node (1 for no ranks).
  int most_per_node() const;
  // The nodes of `ranks`, in their order: what a plan of those ranks
  // alone takes (PlanInput::nodes). Empty for one node.
  std::vector<int32_t> NodesOf(const std::vector<int32_t>& ranks) const;
  bool SameNode(int a, int b) const {
    return node.empty() || node[a] == node[b];
  }
};

// One way of splitting a job's ranks into owner groups
// (OwnershipPlan::groups): grouping[g][s] is the s-th worker of group g.
using OwnerGrouping = std::vector<std::vector<int32_t>>;

// The owner groupings a job's plan may get on `topology` (PlanOnTopology
// weighs them): for every k that divides the node count and is below it,
// smallest first, groups of k whole nodes each (the nodes in the order of
// their numbers, k at a time; a group's workers in rank order). Offered
// when the workers span more than one node, every node has as many, none
// is dedicated (`dedicated` == 0) and every matrix is replicated (every
// trainer holds every gradient whole, so each group's owners compute
// every update from their own trainers' gradients, and updates never leave
// the group). Otherwise none (empty): one group of every worker.
std::vector<OwnerGrouping> ChooseOwnerGroupings(
    const std::vector<MatrixSpec>& matrices, const Topology& topology,
    int workers, int dedicated);

// The exchange nodes (OwnershipPlan::exchange_nodes) a job's plan may get
// on `topology` (PlanOnTopology weighs them): the topology's nodes, node k
// the k-th by number, its ranks in rank order. Offered when the workers
// span more than one node, every node has as many, none is dedicated
// (`dedicated` == 0) and some matrix is unreduced. Otherwise none (empty).
std::vector<std::vector<int32_t>> ChooseExchangeNodes(
    const std::vector<MatrixSpec>& matrices, const Topology& topology,
    int workers, int dedicated);

struct ClockSettings {
  Topology topology;
  int wire_bytes_per_element = 4;    // gradients (the worker sends fp32)
  int update_bytes_per_element = 2;  // updates (bf16 Newton-Schulz)
  double hbm_bytes_per_second = 4.3e12;
  // The fixed host cost of a step's two awaited control rounds, and of it
  // the agreement's (the rest the vote's): fitted to two H200s' timelines
  // over TCP of the 8-layer Llama set, where the agreement took 2.3-2.8 ms
  // (host_ms.agreed, median 2.5, of the steps that compute nothing ahead
  // of it,
  // bench/results/2026-11-30-h200x2-step-control-over-tcp-and-compute-ahead.jsonl)
  // and the commit about 1.5 ms more than its apply; the 2-GPU
  // validations hold with 2.5 to 4 for both.
  double control_rounds_ms = 4.0;
  double agreement_ms = 2.5;
  // A rank's host time per control message, and the fanout of the tree
  // the messages pass along (server/worker/step_control.h; 0: a star).
  // Each of a step's kControlRoundsAwaited rounds gathers every rank's
  // message at rank 0 and broadcasts its answer, from neighbor to
  // neighbor along the tree, one message after another on each rank: the
  // busiest path has ControlMessagesOnPath of them (bench/control_rounds),
  // on top of control_rounds_ms. Only where the clocked workers are the
  // job's ranks (a group clocked alone is not): the coordinator leaves it
  // 0, since a term of the job's size does not change which plan wins.
  double control_message_us = 0;
  int control_tree_fanout = 0;
  double transfer_contention = 0;
  bool peer_writes = true;
  // The workers may apply the updates before the votes where that is
  // faster (server/worker/step_staging.h, EarlyApply::kUndoable; only
  // several workers, and with owner groups only where MayApplyBeforeVotes):
  // each on its compute stream once
  // its own stacks are done, each bucket once it landed, what it overwrites
  // copied aside first (8 more bytes a parameter), so the commit pays only
  // what is left of them after the stage. ClockStep clocks both ways and
  // takes the faster (StepClock::applies). False: the commit
  // applies every update (as the workers do with --apply_early=false, and
  // as every measured multi-GPU step did).
  bool apply_early = false;
  // The workers may sum unreduced gradients by the two-level exchange and
  // relay the rows of row_sharded ones (OwnershipPlan::exchange_nodes)
  // where PlanOnTopology predicts it shorter than the rings and the
  // straight gathers. False: never.
  bool node_exchange = true;
  // What the workers' trainers hold (by worker index): a whole expert of a
  // stack sharded on its experts moves only between its owner and the
  // member holding it (nothing where they are one). Not known: clocked as
  // rows from every member.
  TrainerShards trainer_shards;
  // By rank: the bytes each worker may allocate beside its Newton-Schulz
  // workspace (WorkerSpec::memory_bytes less PlanOptions::workspace_bytes;
  // a draining worker's are not checked: give it the most). PlanOnTopology
  // takes exchange nodes only where every worker also holds their buffers
  // (ExchangeBuffersOf) beside its owned matrices
  // (OwnershipPlan::worker_memory_bytes). Empty: not checked.
  std::vector<int64_t> capacity_bytes;
};

// Whether the workers of a plan of `groups` owner groups (0 or 1: none) may
// apply a step's updates before its votes (the worker's StepEngine::
// MayApplyEarly): without groups, yes; with them, whose copies of the
// momentum survive a killed worker, only where a peer's trainer can repair
// the parameters it left written part-way: no matrix is row-sharded
// (HSDP's are), so every trainer keeps every matrix whole.
bool MayApplyBeforeVotes(const std::vector<MatrixSpec>& matrices,
                         size_t groups);

// The rounds of a step that gather at rank 0 and answer every rank before
// the trainer's stream may go on: the agreement and the vote
// (server/worker/step_run.h). The third, the confirmation, follows the
// commit's writes and the done counter that releases the trainer's stream
// (step_commit.h), so the next forward does not wait for it, nor does a
// step timed as bench/step_gpu times one (until the trainer's stream saw
// the parameters); the next step's agreement waits for it, but that comes
// a forward and a backward later.
inline constexpr int kControlRoundsAwaited = 2;

// The messages one round passes through one after another on its
// busiest path among `workers` ranks on a tree of `fanout` (0: a star):
// up the tree, each rank on the way receives its children's and sends its
// parent one (rank 0 has none); down, the reverse. 2 (workers - 1) for a
// star; 2 (k + (depth - 1)(k + 1)) for a tree of k children and `depth`
// levels below rank 0.
double ControlMessagesOnPath(int workers, int fanout);

// Seconds of a step's agreement and of its vote among `workers` ranks:
// each its part of control_rounds_ms (agreement_ms, and the rest) plus
// control_message_us for each message on its busiest path
// (ControlMessagesOnPath). ControlSeconds: both. 0 for one worker: a step
// alone on its worker runs no rounds between ranks (it is decided once
// its gradients are checked; server/worker/step_run.cc), and its applies,
// which then run beside its Newton-Schulz and slow it by about their own
// time, stay counted in the commit.
double AgreementSeconds(int workers, const ClockSettings& settings);
double VoteSeconds(int workers, const ClockSettings& settings);
double ControlSeconds(int workers, const ClockSettings& settings);

// A step clocked with its updates applied both ways (ClockSettings::
// apply_early): the commit's apply, what is left after the stage of the
// applies before the votes, and whether the second is less (then it is
// StepClock::apply_seconds).
struct ApplyWays {
  double at_commit_seconds = 0;
  double left_seconds = 0;
  bool before_votes = false;
};

struct StepClock {
  // The step: stage_seconds + commit_seconds.
  double predicted_seconds = 0;
  // Every update has landed and every compute stream is done.
  // (from the step's start: the agreement's end or before, see below).
  double stage_seconds = 0;
  double commit_seconds = 0;  // VoteSeconds + apply_seconds
  // When the agreement ends (AgreementSeconds), and per worker when its
  // stage began: 0 where it computes its first stack ahead of the
  // agreement, else the agreement's end (as a worker's timeline counts).
  double agreement_seconds = 0;
  std::vector<double> worker_stage_begin_seconds;
  // The commit's apply, or what is left of the applies before the votes
  // once the stage is done (applies.before_votes).
  double apply_seconds = 0;
  // Where both ways were clocked (ClockSettings::apply_early).
  ApplyWays applies;
  // The last bucket's gradients have landed (the agreement's end with
  // none to move).
  double gradients_landed_seconds = 0;
  // Per worker: the sum of its stack times, when its compute stream is
  // done (its stage's begin for one that owns nothing), and the stacks it
  // computes in order (StepSchedule::stacks indices).
  std::vector<double> worker_compute_seconds;
  std::vector<double> worker_compute_end_seconds;
  std::vector<std::vector<int>> worker_stacks;
  double compute_end_seconds_max = 0;
  // The step's critical path, in four parts that add up to
  // predicted_seconds: the compute of the worker whose compute ends last,
  // the time its compute stream waited for gradients (and the agreement
  // where it waited for it), the updates still
  // going back after that, and the commit. `limited_by` names the largest:
  // "compute", "gradients", "updates_back" or "commit".
  double critical_compute_seconds = 0;
  double critical_wait_seconds = 0;
  double updates_tail_seconds = 0;
  std::string limited_by;
  // Busy time of the transfer timeline, and the latency part of it (of
  // each phase, its slowest group's; of each launch of the exchange's
  // pipelines, its own and its other transfers'; peer writes: every
  // owner's writes of the group that writes longest).
  double transfer_seconds = 0;
  double latency_seconds = 0;
  // Largest per-GPU wire bytes of the step (max of sent and received).
  int64_t bytes_per_gpu = 0;
  // Transfer phases with at least one transfer (peer writes: each
  // owner's writes of a bucket, in the group with the most writers).
  int phases = 0;
  // With exchange nodes: the launches of the exchange's pipelines, each
  // sequence's B + L - 1 (0 without).
  int exchange_launches = 0;
};

// Seconds to apply `elements` parameters before the votes: each copied
// aside first (the fp32 parameter read and written), then applied as the
// commit does, at `settings.hbm_bytes_per_second`.
double ApplyBeforeVotesSeconds(double elements, const ClockSettings& settings);

// Seconds of the commit's apply on the busiest of `workers` trainers: the
// fp32 parameter read and written and the update read, for every
// parameter that trainer holds (all of a matrix, 1/workers of a
// row-sharded one's rows), at `settings.hbm_bytes_per_second`.
double ApplySeconds(const std::vector<MatrixSpec>& matrices, int workers,
                    const ClockSettings& settings);

// The bucket bounds ChooseStepGrouping clocks where it chooses, largest
// first: one bucket of every matrix (at least 64 MiB), then 4 GiB, 1 GiB,
// 256 MiB and 64 MiB, each where it is below the whole.
std::vector<int64_t> BucketBoundsTried(const std::vector<MatrixSpec>& matrices);

// Bytes a worker's compute stream moves through memory per element of a
// stack before its Newton-Schulz (StepStaging::Compute): the momentum
// kernel reads the gradient and the previous momentum and writes the new
// momentum and the Newton-Schulz input, all fp32. An unreduced matrix's
// summed gradient is first scaled to the mean in place (one more read and
// write). The cost table times Newton-Schulz alone (muonps-autotune).
inline constexpr int kMomentumBytesPerElement = 4 * 4;
inline constexpr int kMeanBytesPerElement = 2 * 4;

// Seconds of each stack of `schedule` (of `matrices`): one Newton-Schulz
// call per chunk on its owner's model (`models[owner]`), and the momentum's
// pass over memory before them (kMomentumBytesPerElement, and
// kMeanBytesPerElement for an unreduced matrix, per element at
// `settings.hbm_bytes_per_second`), divided by the owner's speed as the
// model divides Newton-Schulz.
std::vector<double> StackSeconds(const std::vector<MatrixSpec>& matrices,
                                 const StepSchedule& schedule,
                                 const std::vector<const CostModel*>& models,
                                 const ClockSettings& settings);

// Clocks one step of `schedule` (of `matrices`, on `workers` ranks: its
// plan's, whose owner groups StepSchedule::groups has) whose stacks take
// `stack_seconds`. `settings.topology.node` must be empty or have
// `workers` entries.
StepClock ClockStep(const std::vector<MatrixSpec>& matrices,
                    const StepSchedule& schedule,
                    const std::vector<double>& stack_seconds, int workers,
                    const ClockSettings& settings);

// How a plan's transfers are grouped into phases: the schedule's bucket
// bound. Within one node a step gains from many small phases (updates go
// back while later stacks compute); across nodes every phase pays a ring's
// fill over all ranks and a row gather is bound by its owners' NICs, so
// fewer, larger phases win. A plan whose owner groups each lie on one node
// counts as one node: each group's transfers stay on its node. The candidates
// are one bucket of everything, then 64 MiB times 64, 16, 4 and 1 (those
// smaller than everything).
struct StepGrouping {
  int64_t bucket_bytes = int64_t{64} << 20;
  double predicted_seconds = 0;  // of the chosen bound (0: not clocked)
  // The chosen bound's clock's StepClock::applies.
  ApplyWays applies;
  // The candidates clocked, in the order tried, with their predicted step.
  std::vector<std::pair<int64_t, double>> candidates;
  StepSchedule schedule;  // cut at bucket_bytes
};

// The step schedule of `plan` with its bucket bound: `options.bucket_bytes`
// when > 0 (not clocked); else on one node (every worker, or every owner
// group's workers, on one node) 64 MiB, the bound every 1-4 GPU
// measurement used (not clocked; the clock also prefers it there for the
// Llama-3-8B sets); else the candidates clocked largest first until two in
// a row do not beat the best so far (every candidate is a cut of one
// schedule: one set of stacks, StepScheduleCutter), and the best (ties: the
// smaller bound). `plan` is the planner's: its batches are not checked
// again (CheckStepPlan). Errors: StepScheduleCutter's.
absl::StatusOr<StepGrouping> ChooseStepGrouping(
    const std::vector<MatrixSpec>& matrices, const OwnershipPlan& plan,
    const std::vector<const CostModel*>& models, const ClockSettings& settings,
    const ScheduleOptions& options = {.bucket_bytes = 0});

// How PlanOnTopology weighed a plan against the alternatives it clocked
// beside it (TopologyPlan::weighed).
struct PlanWeighing {
  // Where owner groupings were offered to be weighed: the predicted step of
  // the best grouped plan (0 if none could be made) and of the plan of
  // every worker, each grouping tried (its workers per group and predicted
  // step, 0 where its plan could not be made or it was passed over
  // unplanned), and why the groups were not taken ("" when they were).
  // Where they were required: grouped_seconds
  // is the grouping's prediction (0 where it was not clocked), the rest
  // stays unset.
  bool groups_offered = false;
  double grouped_seconds = 0;
  double ungrouped_seconds = 0;
  // The plan of every worker was not made: a grouping planned beside it
  // predicted no more than its least step (StepBound), which
  // ungrouped_seconds is then.
  bool ungrouped_passed_over = false;
  std::vector<std::pair<int, double>> grouped_candidates;
  std::string groups_declined;
  // Where trainers hold whole experts and their shards are known
  // (ClockSettings::trainer_shards): the predicted step of the plan with
  // every whole expert owned where it is held (PlanOptions::
  // experts_at_holders) and of the one that leaves them there only where
  // that costs nothing, and whether the first was taken (it was the
  // faster). 0 and false where not weighed.
  double at_holders_seconds = 0;
  double where_free_seconds = 0;
  bool experts_at_holders = false;
  // Where `settings.apply_early` and the plan has several workers that
  // may apply before the votes (MayApplyBeforeVotes): the step predicted
  // with every update applied before the votes and at the commit, and
  // whether the workers apply them at the commit (the first was no
  // faster). 0 and false where not weighed (one worker, or HSDP's owner
  // groups: those apply at the commit anyway).
  double before_votes_seconds = 0;
  double at_commit_seconds = 0;
  bool apply_at_commit = false;
  // Where exchange nodes were offered (ChooseExchangeNodes, for a plan
  // without owner groups): the predicted step of the plan's schedule with
  // them (its own bucket bound) and with the rings. The plan has them
  // (TopologyPlan::plan's exchange_nodes) where the first was shorter. 0 and
  // false where not weighed.
  bool exchange_offered = false;
  double exchange_seconds = 0;
  double rings_seconds = 0;
  // The schedule with them was not made: its least step
  // (ExchangeStepBound, step_bound.h), which exchange_seconds is then, was
  // no shorter than the rings'.
  bool exchange_passed_over = false;
  // Why the exchange was not taken although it was predicted the shorter:
  // some worker has no room for its buffers (ClockSettings::
  // capacity_bytes), named with the bytes it lacks. "" otherwise.
  std::string exchange_declined;
};

// A plan of a job's workers on a topology, its step schedule, and how
// PlanOnTopology weighed it.
struct TopologyPlan {
  OwnershipPlan plan;
  // The plan's schedule; for an owner grouping weighed and taken, its first
  // group's alone (each group's is that one on its own members: the same
  // buckets), with that group's clock.
  StepGrouping grouping;
  PlanWeighing weighed;
};

// Plans ranks `ranks` (indices into the job's workers, in order): the
// planner's plan of those workers, their ids as worker_ids in that order.
// `grouping` is null for the plan of every rank, else the grouping whose
// first group `ranks` is: the plan will be copied over its groups.
// `experts_at_holders`: the plan's PlanOptions::experts_at_holders (its
// PlanInput::trainer_shards those of `settings`, ClockSettings, among
// `ranks`: TrainerShards::Among).
using PlanRanks = std::function<absl::StatusOr<OwnershipPlan>(
    const std::vector<int32_t>& ranks, const OwnerGrouping* grouping,
    bool experts_at_holders)>;

// What PlanOnTopology does with the owner groupings it is given.
enum class OwnerGroupsUse {
  // Weighed against each other and the plan of every worker
  // (ChooseOwnerGroupings' groupings).
  kWeighed,
  // The plan has them (a job's own groups: HSDP's replica groups; exactly
  // one grouping).
  kRequired,
};

// The plan of `worker_ids.size()` workers (the last `dedicated` with no
// trainer) and its schedule (ChooseStepGrouping with `models` by rank,
// `settings` and `options`). Without `offered` owner groupings (from
// ChooseOwnerGroupings, a job's own, or none) every rank is planned at
// once. A grouped plan is the first group's workers planned and copied
// over the groups (ReplicateOverGroups). A grouping `kRequired` makes the
// plan alone (errors: its own, or its schedule's; INVALID_ARGUMENT for
// other than one grouping). Groupings `kWeighed` are planned beside the
// plan of every rank: each is clocked as its first group alone on that
// group's nodes (the groups are copies of one placement on alike nodes,
// each on its own links, so the whole step takes as long as one group's):
// groups of one node first (no update crosses a network port), then the
// larger groupings, largest first, until two in a row do not beat the best
// so far, one cannot be planned (smaller groups hold less memory), or a
// group's Newton-Schulz alone (OwnershipPlan::work_seconds over its workers
// at the fastest model's speed) would outlast the best; the shortest
// predicted step wins (ties: the groups, whose updates cross
// fewer links). The winner's schedule is cut at the bucket bound its group
// chose. Where trainers hold whole experts (ClockSettings::trainer_shards
// known), the plan of every rank, or a required grouping's, is also made
// with every expert owned where it is held, and the faster of the two by
// the clock stands (PlanWeighing::experts_at_holders). With
// `settings.apply_early` every plan whose workers may
// (MayApplyBeforeVotes; a grouping as its first group alone) is clocked
// with the faster of its updates applied before the votes and at the
// commit, and the chosen one says which (PlanWeighing::apply_at_commit). A
// grouped plan that
// cannot be made (one group too small for the momentum) or scheduled is passed
// over, saying why. So is, unplanned and counted as a miss, a grouping whose
// step cannot beat the plan of every rank's: where its updates cross the nodes
// as that plan's do and save less than 1% of that plan's least step on the wire
// while each worker computes more, it waits for that plan's prediction and is
// passed over where its lower bound (step_bound.h: the plan-free transfers, and
// that plan's Newton-Schulz work on its fewer workers at the fastest
// model's speed) exceeds it. The other groupings are planned on a thread
// of their own beside the plan of every rank (`plan_ranks` is called from
// two threads at once). Where that bound holds, the plan of every rank
// waits for them, and is not made at all where the best of them predicts
// no more than its own least step (PlanWeighing::ungrouped_passed_over).
// Where exchange nodes are on offer (`settings.node_exchange`, and
// ChooseExchangeNodes: several nodes of as many workers, none dedicated,
// some matrix unreduced or sharded by rows), the same plan is also
// scheduled with them (ChooseStepGrouping, its own bucket bound; not planned
// again; where the plan has owner groups, only if every node lies within
// one: CheckExchangeNodes) and clocked, and the shorter step is taken
// (ties: the rings) where every worker has room for its buffers
// (ClockSettings::capacity_bytes; else PlanWeighing::exchange_declined
// says who lacks how much), with its
// schedule and its applies (PlanWeighing::exchange_offered); unless the
// exchange's least step (step_bound.h: its launches, its busier link's
// levels and its HBM time for every unreduced element, whoever owns it) is
// no shorter than the rings' step: then it is passed over unscheduled
// (PlanWeighing::exchange_passed_over).
// Errors: the plan of every rank's, or its schedule's (where a grouped plan
// could be made, it stands alone then).
absl::StatusOr<TopologyPlan> PlanOnTopology(
    const std::vector<MatrixSpec>& matrices,
    const std::vector<std::string>& worker_ids, int dedicated,
    const std::vector<const CostModel*>& models, const ClockSettings& settings,
    const ScheduleOptions& options, const std::vector<OwnerGrouping>& offered,
    OwnerGroupsUse use, const PlanRanks& plan_ranks);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_STEP_CLOCK_H_
