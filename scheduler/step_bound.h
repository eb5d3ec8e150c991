// Internal to the step clock: a lower bound on the step ChooseStepGrouping
// predicts for a plan of some of a job's ranks, known before the plan is
// made, so that PlanOnTopology can pass over an owner grouping that cannot
// beat the plan of every worker without planning it.
//
// It holds where every matrix is replicated, no worker is dedicated and
// the ranks span more than one node: then every transfer is an update
// broadcast by a ring among all the ranks (no gradient moves, no peer
// writes), whose bytes, messages and ring hops do not depend on who owns
// what, and the buckets are cut from the matrices alone. Every phase runs
// one after another on the transfer timeline, and the last one starts
// after all compute, so the stage lasts at least the sum of the phases,
// and at least the busiest worker's compute plus the shortest phase; the
// commit then applies every update. Where the workers may apply them
// before the votes instead (ClockSettings::apply_early; with owner groups
// too, every matrix being replicated), a worker applies them all after its
// own stacks: the step then lasts at least the stage, and at least the
// busiest worker's compute plus those applies. The bound is the least of
// either over the bucket bounds ChooseStepGrouping may choose, plus the
// control rounds, less a relative 1e-9 for rounding.
//
// Immutable after construction; safe to share between threads.
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
  double control_seconds_ = 0;
  double apply_at_commit_seconds_ = 0;
  // Every update applied before the votes (ClockSettings::apply_early);
  // -1: the applies are at the commit.
  double apply_before_votes_seconds_ = -1;
  // Per bucket bound that ChooseStepGrouping may choose, its buckets.
  std::vector<std::vector<BucketSum>> cuts_;
};

}  // namespace scheduler
}  // namespace muonps

#endif  // MUONPS_SCHEDULER_STEP_BOUND_H_
