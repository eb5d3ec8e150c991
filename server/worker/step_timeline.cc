// StepRun's account of a staged step (step_run.h): from the marks' device
// times, how long the owned stacks kept the compute stream busy, the plan's
// prediction of that, and the debug-level timeline line (the step's marks
// with their device and host times) that the benches read.
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "server/worker/step_run.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

double StepRun::ComputeBusyMs(const std::vector<double>& ms) const {
  double busy = 0, began = -1;
  for (const TimelineMark& m : timeline_) {
    if (m.mark >= static_cast<int>(ms.size())) continue;
    if (absl::string_view(m.what) == "compute_begin") {
      began = ms[m.mark];
    } else if (absl::string_view(m.what) == "compute" && began >= 0) {
      busy += ms[m.mark] - began;
      began = -1;
    }
  }
  return busy;
}

double StepRun::PredictedComputeSeconds() const {
  double seconds = 0;
  for (const scheduler::Batch& b : plan_.ownership.batches) {
    if (b.worker == plan_.rank) seconds += b.seconds;
  }
  return seconds;
}

void StepRun::LogTimeline(const std::vector<double>& ms) const {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  const auto since = [&](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t - host_.begin).count();
  };
  // One JSON line: when each phase's work was done, in ms after the step's
  // transfers began (device time: CUDA events), and when the host recorded
  // each mark (ms after Run began).
  std::string line, issued;
  for (const TimelineMark& m : timeline_) {
    if (m.mark >= static_cast<int>(ms.size())) continue;
    absl::StrAppend(&line, line.empty() ? "" : ",", "[\"", m.what, "\",",
                    m.index, ",", absl::StrFormat("%.3f", ms[m.mark]), "]");
    absl::StrAppend(&issued, issued.empty() ? "" : ",",
                    absl::StrFormat("%.3f", since(m.issued)));
  }
  // And the host's view: ms after Run began when the ranks agreed, the
  // staged work was done, and the step committed (vote, apply, confirm).
  spdlog::debug(
      "step timeline {{\"step\":{},\"rank\":{},\"version\":{},"
      "\"host_ms\":{{\"agreed\":{:.3f},\"staged\":{:.3f},"
      "\"committed\":{:.3f}}},\"marks\":[{}],\"issued_ms\":[{}]}}",
      step_id_, plan_.rank, plan_.version, since(host_.agreed),
      since(host_.staged), since(std::chrono::steady_clock::now()), line,
      issued);
}

}  // namespace worker
}  // namespace muonps
