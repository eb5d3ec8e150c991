// MeasuredSpeed: how fast a worker's GPU runs its Newton-Schulz in
// training, as its steps measure it against the plan's prediction, and
// RebalanceByMeasurement: whether those measurements call for a new plan.
//
// A worker's cost table is measured when it starts, on an idle GPU. In
// training its GPU shares power, clocks and SMs with the trainer, NCCL and
// its neighbours: on 2 H200s of one host one rank's stacks ran 8-15% slower
// than the other's, stack for stack, step after step. Each step a worker
// reports the device time its stacks took (ns_seconds) beside what the plan
// predicted for them; the ratio is its speed against the cost table, the
// about the same for any set of matrices it owns. Plans multiply the
// worker's speed by `factor()`, so a job whose ranks measure unequal
// re-plans with the measured speeds (scheduler::Replan moves the cheapest
// momentum), and the busiest rank comes within the plan's granularity of
// the mean.
//
// A re-plan is a trial (SpeedBalance): the speeds a GPU shows depend a
// little on what it runs beside what (Newton-Schulz beside NCCL's kernels
// runs ~12% slower), and a plan balanced on Newton-Schulz alone may end its
// step on a larger transfer. So the step time the ranks report under the
// new plan is compared with the one before it: a plan that did not shorten
// the step by 1% ends the trials, and one that lengthened it by 1% is
// undone.
//
// Thread-compatible (they live in the JobTable, under its mutex).
#ifndef MUONPS_SERVER_COORDINATOR_MEASURED_SPEED_H_
#define MUONPS_SERVER_COORDINATOR_MEASURED_SPEED_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/coordinator/worker_types.h"

namespace muonps {
namespace coordinator {

class MeasuredSpeed {
 public:
  // Steps a measurement takes: the median of this many steps under plans
  // that used the current factor.
  static constexpr int kWindow = 5;

  // What plans multiply the worker's joined speed by (1 until measured).
  double factor() const { return factor_; }
  // The first plan version that uses factor().
  int64_t since_version() const { return since_version_; }

  // A step the worker reported: kept when it ran under a plan version at
  // or above since_version() and both its times are positive (a worker
  // that owns nothing measures nothing). The newest kWindow are kept.
  void Add(const StepStats& stats);
  // Whether kWindow steps at factor() were measured.
  bool measured() const { return static_cast<int>(samples_.size()) >= kWindow; }
  // The median measured Newton-Schulz seconds of those steps.
  double MedianSeconds() const;
  // Their step wall times (StepStats::step_seconds), oldest first.
  std::vector<double> StepSeconds() const;
  // factor() times the median of predicted / measured: the factor under
  // which the plan would have predicted what the steps took.
  double Estimate() const;

  // Plans from `version` on use `factor`; the measurement starts again.
  void Set(double factor, int64_t version);

 private:
  struct Sample {
    double measured = 0;
    double predicted = 0;
    double step = 0;
  };
  double factor_ = 1.0;
  int64_t since_version_ = 0;
  std::vector<Sample> samples_;  // oldest first
};

// One rank of a job's newest plan, as the balance check sees it.
struct RankSpeed {
  std::string worker_id;
  const MeasuredSpeed* speed = nullptr;
  // The plan gives it matrices to orthogonalize.
  bool owns = false;
  // Its device is a GPU: a CPU worker's times measure the host's load
  // (the cores its peers and trainers share), not a device.
  bool gpu = false;
};

// New factors for a job's ranks, in their order, and why.
struct Rebalance {
  std::vector<double> factors;
  // The busiest rank's measured seconds over the mean, minus 1.
  double imbalance = 0;
  std::string reason;
};

// A rebalance when every rank that owns matrices is a GPU measured over
// kWindow steps (at least two of them), the busiest is more than `tolerance`
// and more than kMinGainSeconds above the mean, and some rank's estimate
// differs from its factor by more than `tolerance` (a plan that already used
// what they measure is as balanced as its granularity lets it be: no re-plan
// until the speeds move). Ranks that own nothing keep their factor. nullopt
// otherwise, and always for tolerance <= 0.
std::optional<Rebalance> RebalanceByMeasurement(
    const std::vector<RankSpeed>& ranks, double tolerance);
// A plan change costs one step of about a second (new communicators, the
// momentum moved): a re-plan must be able to win at least this much a step.
// Small models' steps (a few ms, their imbalance launch jitter) never
// re-plan.
inline constexpr double kMinGainSeconds = 1e-3;

// One job's re-plans by measured speeds, one trial at a time. Open: a
// RebalanceByMeasurement starts a trial, remembering the factors and the
// median step time of the window that asked for it. Trial: once every
// owner measured its window under the new factors, a median step time 1%
// shorter opens it again (another trial may follow); 1% longer undoes it
// (the factors before, as the next plan's) and settles; anything between
// settles. Settled: no more re-plans until the plan's ranks change.
class SpeedBalance {
 public:
  // What the job's next plan should use for `ranks` (its newest plan's, in
  // rank order), if anything.
  std::optional<Rebalance> Consider(const std::vector<RankSpeed>& ranks,
                                    double tolerance);

 private:
  enum class State { kOpen, kTrial, kSettled };
  State state_ = State::kOpen;
  // The ranks the trial or settlement is of.
  std::vector<std::string> ids_;
  std::vector<double> before_factors_;
  double before_step_seconds_ = 0;
};

}  // namespace coordinator
}  // namespace muonps

#endif  // MUONPS_SERVER_COORDINATOR_MEASURED_SPEED_H_
