#include "server/worker/step_timeline.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace muonps {
namespace worker {

double StepTimeline::ComputeBusyMs(const std::vector<double>& ms) const {
  double busy = 0, began = -1;
  for (const Mark& m : marks_) {
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

void StepTimeline::Log(const std::vector<double>& ms, int64_t step_id,
                       const PlanState& plan) const {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  const auto since = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t - begin_).count();
  };
  // When each phase's work was done, in ms after the step's transfers
  // began (device time: CUDA events), and when the host recorded each mark.
  std::string line, issued;
  for (const Mark& m : marks_) {
    if (m.mark >= static_cast<int>(ms.size())) continue;
    absl::StrAppend(&line, line.empty() ? "" : ",", "[\"", m.what, "\",",
                    m.index, ",", absl::StrFormat("%.3f", ms[m.mark]), "]");
    absl::StrAppend(&issued, issued.empty() ? "" : ",",
                    absl::StrFormat("%.3f", since(m.issued)));
  }
  // The owned stacks: [index, matrices, rows, cols, "algorithm x count"...].
  std::string stacks;
  for (size_t s = 0; s < plan.batch_of_stack.size(); ++s) {
    const int b = plan.batch_of_stack[s];
    if (b < 0) continue;
    const ComputeBatch& batch = plan.batches[b];
    absl::StrAppend(&stacks, stacks.empty() ? "" : ",", "[", s, ",",
                    batch.items.size(), ",", batch.rows, ",", batch.cols);
    for (const scheduler::StackChunk& c : batch.chunks) {
      absl::StrAppend(&stacks, ",\"", NsAlgorithmName(c.algorithm), " x ",
                      c.count, "\"");
    }
    absl::StrAppend(&stacks, "]");
  }
  // And the host's view: when the ranks agreed, the staged work was done,
  // and the step committed (vote, apply, confirm).
  spdlog::debug(
      "step timeline {{\"step\":{},\"rank\":{},\"version\":{},"
      "\"host_ms\":{{\"agreed\":{:.3f},\"staged\":{:.3f},"
      "\"committed\":{:.3f}}},\"began_at_ms\":{:.3f},\"marks\":[{}],"
      "\"issued_ms\":[{}],\"stacks\":[{}]}}",
      step_id, plan.rank, plan.version, since(agreed_), since(staged_),
      since(Clock::now()),
      std::chrono::duration<double, std::milli>(begin_.time_since_epoch())
          .count(),
      line, issued, stacks);
}

double PredictedComputeSeconds(const PlanState& plan) {
  if (plan.rank < 0) return 0;
  // The plan lists the first owner group's batches: this worker runs those
  // of the first group's member at its position.
  const int32_t as = plan.groups.InFirstGroup(plan.rank);
  double seconds = 0;
  for (const scheduler::Batch& b : plan.ownership.batches) {
    if (b.worker == as) seconds += b.seconds;
  }
  return seconds;
}

}  // namespace worker
}  // namespace muonps
