// StepTimeline: a staged step's account. The stage records a device mark
// (DeviceOps::Mark) where each phase's work ends ("begin", "to_owners" /
// "from_owners" of bucket `index`, "compute_begin" / "compute" of stack
// `index`), and the host times of the round's milestones; once the marks
// are done, the timeline says how long the owned stacks kept the compute
// stream busy and logs one debug-level JSON line (device and host times)
// that the benches read. Used by one thread (the step's).
#ifndef MUONPS_SERVER_WORKER_STEP_TIMELINE_H_
#define MUONPS_SERVER_WORKER_STEP_TIMELINE_H_

#include <chrono>
#include <cstdint>
#include <vector>

#include "server/worker/step_state.h"

namespace muonps {
namespace worker {

class StepTimeline {
 public:
  using Clock = std::chrono::steady_clock;

  // The round begins now: host times are counted from here.
  StepTimeline() : begin_(Clock::now()) {}
  StepTimeline(const StepTimeline&) = delete;
  StepTimeline& operator=(const StepTimeline&) = delete;

  // Forgets the marks (a new stage).
  void ClearMarks() { marks_.clear(); }
  // Device mark `mark` ends `what` (a string literal) of `index`; the host
  // recorded it now.
  void AddMark(const char* what, int index, int mark) {
    marks_.push_back({what, index, mark, Clock::now()});
  }
  // The ranks agreed; the staged work was done.
  void Agreed() { agreed_ = Clock::now(); }
  // When the stage issued its first mark ("begin"): before the round when a
  // stack was computed ahead of it. `otherwise` when there is none.
  Clock::time_point FirstIssued(Clock::time_point otherwise) const {
    return marks_.empty() ? otherwise : marks_.front().issued;
  }
  void Staged() { staged_ = Clock::now(); }

  // From the marks' times (DeviceOps::MarkTimesMs): the ms the compute
  // stream spent between each "compute_begin" and its "compute".
  double ComputeBusyMs(const std::vector<double>& ms) const;
  // At debug level: the step's marks with their device times (ms after
  // "begin") and host times, the host's milestones (ms after the round
  // began), when the round began on the steady clock (CLOCK_MONOTONIC on
  // Linux: the benches set it beside their trainers' own times), and what
  // each owned stack of `plan` holds (its schedule index,
  // matrices, shape and each chunk's algorithm), as one JSON line.
  void Log(const std::vector<double>& ms, int64_t step_id,
           const PlanState& plan) const;

 private:
  struct Mark {
    const char* what;
    int index;
    int mark;
    // A device mark far behind its host time waited for the device; one
    // close to it, for the host.
    Clock::time_point issued;
  };
  const Clock::time_point begin_;
  Clock::time_point agreed_, staged_;
  std::vector<Mark> marks_;
};

// The plan's prediction of this worker's compute time: its batches'
// Newton-Schulz seconds.
double PredictedComputeSeconds(const PlanState& plan);

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_TIMELINE_H_
