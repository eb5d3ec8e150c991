// Internal to the step clock: lower bounds on the step ChooseStepGrouping
// predicts, known before a plan or its schedule is made, so that
// PlanOnTopology can pass over an owner grouping that cannot beat the plan
// of every worker without planning it (StepBound), and the exchange that
// cannot beat the rings without scheduling it (ExchangeStepBound).
//
// StepBound holds where every matrix is replicated, no worker is dedicated
// and the ranks span more than one node: then every transfer is an update
// broadcast by a ring among all the ranks (no gradient moves, no peer
// writes; exchange nodes, OwnershipPlan::exchange_nodes, change nothing:
// they carry only unreduced matrices), whose bytes, messages and ring hops
// do not depend on who owns what, and the buckets are cut from the
// matrices alone. Where some matrix is unreduced there is none: its
// transfers, by rings or by the exchange, depend on the plan. Every phase
// runs one after another on the transfer timeline from the agreement's
// end, and the last one starts after all compute (whose first stack may
// run during the agreement), so the stage lasts at least the agreement
// plus the sum of the phases, and at least the busiest worker's compute
// plus the shortest phase; the
// commit then applies every update. Where the workers may apply them
// before the votes instead (ClockSettings::apply_early; with owner groups
// too, every matrix being replicated), a worker applies them all after its
// own stacks: the step then lasts at least the stage, and at least the
// busiest worker's compute plus those applies. The bound is the least of
// either over the bucket bounds ChooseStepGrouping may choose, plus the
// vote, less a relative 1e-9 for rounding. The rounds' messages
// (ClockSettings::control_message_us) are left out, which only lowers it.
//
// StepBound is immutable after construction and safe to share between
// threads; the functions are thread-safe.
#ifndef MUONPS_SCHEDULER_STEP_BOUND_H_
#define MUONPS_SCHEDULER_STEP_BOUND_H_

#include <cstdint>
#include <vector>

#include "scheduler/plan_types.h"
#include "scheduler/step_clock.h"
#include "scheduler/step_schedule.h"

namespace muonps {
namespace scheduler {

class StepBound {
 public:
  // `matrices`, `settings` and `options` as PlanOnTopology gets them, with
  // `dedicated` trainerless workers.
  StepBound(const std::vector<MatrixSpec>& matrices,
            const ClockSettings& settings, const ScheduleOptions& options,
            int dedicated);

  // The least predicted step (ClockStep's predicted_seconds, as
  // ChooseStepGrouping chooses it) of a plan of `ranks` (indices into the
  // topology's ranks) clocked alone on their nodes, whose busiest worker
  // computes for at least `compute_seconds`. 0 where none holds (see
  // above).
  double Seconds(const std::vector<int32_t>& ranks,
                 double compute_seconds) const;
  // The same for each bucket bound ChooseStepGrouping may choose, in the
  // order it tries them (BucketBoundsTried; the one bound of
  // `options.bucket_bytes` where it was set); empty where none holds.
  std::vector<double> CutSeconds(const std::vector<int32_t>& ranks,
                                 double compute_seconds) const;

 private:
  // One bucket's updates back: its broadcasts and their bytes.
  struct BucketSum {
    int64_t messages = 0;
    double bytes = 0;
  };

  const ClockSettings& settings_;
  bool holds_ = false;
  // The control rounds' fixed parts (without their messages): every
  // transfer waits for the agreement, the commit for the vote.
  double agreement_seconds_ = 0;
  double vote_seconds_ = 0;
  double apply_at_commit_seconds_ = 0;
  // Every update applied before the votes (ClockSettings::apply_early);
  // -1: the applies are at the commit.
  double apply_before_votes_seconds_ = -1;
  // Per bucket bound that ChooseStepGrouping may choose, its buckets.
  std::vector<std::vector<BucketSum>> cuts_;
};

// One launch of one bucket's exchange, one way (step_clock.h's model),
// whoever owns its items: a level's, whose bytes each member moves (sends
// and receives): within each node, or along the rails across the nodes (a
// ring over the nodes, whose launch fills `hops` = M - 1 hops; for
// gradients a reduce, which adds as it moves); or the parts within the
// owner's node, whose bytes depend on who owns what (none here). And the
// HBM seconds on the transfer stream before the launch (the gradients'
// pack copies, before the first) and after it (the adds that follow the
// level within the nodes; the updates' copies out of the pack, after the
// last).
struct ExchangeStep {
  bool across = false;  // along the rails, between the nodes
  bool parts = false;   // within the owner's node
  bool reduce = false;  // a ring reduce (the gradients' rails)
  int hops = 1;         // ring hops its launch fills
  double bytes = 0;
  double hbm_before_seconds = 0;
  double hbm_after_seconds = 0;
};

// The launches of one bucket's exchange in their order: of `nodes` exchange
// nodes of `per_node` workers, `elements` items' elements packed into
// `packed` (NodeExchange::packed()), gradients or (`update`) updates.
// Gradients: within the nodes (where per_node > 1), along the rails (where
// nodes > 1), then the parts within the owner's node (where per_node > 1);
// updates the reverse.
std::vector<ExchangeStep> ExchangeStepsOf(int nodes, int per_node,
                                          double elements, double packed,
                                          bool update,
                                          const ClockSettings& settings);

// A lower bound on the step ClockStep predicts for a schedule of
// `matrices` on `settings`' `workers` ranks with exchange nodes of
// `per_node` workers on each of `nodes` hosts (the topology's nodes, as
// ChooseExchangeNodes gives them), whatever its plan and bucket bound
// (ChooseStepGrouping's choice among them). The transfer timeline runs one
// launch after another, the updates' after the gradients', so the stage
// lasts at least the sum of the launches. Each way, some sequence holds a
// bucket's exchange, each of its steps (ExchangeStepsOf) in a launch of
// its own that lasts at least latency_us + hops hop_latency_us: the rails'
// M - 1 hops, one for the others. A launch lasts at least the larger of
// its NVLink and its NIC seconds, so a way's launches last at least the
// larger of its buckets' levels within the nodes (over NVLink) and along
// the rails (over the NICs), each added up; and the HBM seconds of their
// pack copies and adds, which take turns with the launches on the
// transfer stream. Levels and HBM grow with a bucket's elements (its pack
// at least its elements), so the buckets of the unreduced matrices cost
// at least one bucket of all of them. The control rounds add (the
// agreement before every launch, the vote after the stage), and, where the
// workers may not apply the updates before the votes, their apply. Less a
// relative 1e-9 for rounding; 0 without unreduced matrices.
double ExchangeStepBound(const std::vector<MatrixSpec>& matrices, int workers,
                         int nodes, int per_node,
                         const ClockSettings& settings);

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_STEP_BOUND_H_
