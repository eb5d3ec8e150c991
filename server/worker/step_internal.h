// Internal to the step engine: the wire format of the per-step agreement
// and per-step scratch, shared by step_engine.cc and step_transfers.cc.
#ifndef MUONPS_SERVER_WORKER_STEP_INTERNAL_H_
#define MUONPS_SERVER_WORKER_STEP_INTERNAL_H_

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/worker/step_engine.h"

namespace muonps {
namespace worker {

constexpr size_t kProblemBytes = 480;

// What every rank tells rank 0 before a step.
struct StepHeader {
  int64_t step_id;
  int32_t trainer_rank;
  int32_t trainer_count;
  char problem[kProblemBytes];  // "" or why this rank cannot step
};

// Rank 0's answer: go, or the first problem any rank reported.
struct StepDecision {
  int32_t go;
  char problem[kProblemBytes];
};

inline void CopyProblem(const std::string& text, char* out) {
  std::memset(out, 0, kProblemBytes);
  std::memcpy(out, text.data(), std::min(text.size(), kProblemBytes - 1));
}

inline std::string ItemKey(const std::string& name, int64_t expert) {
  return absl::StrCat(name, "[", expert, "]");
}

inline double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Per-step scratch: staged gradients and updates of this rank's owned
// experts, the trainer rank of every worker rank, and counters.
struct StepEngine::StepContext {
  std::map<std::string, std::vector<float>> staged;  // by item key
  std::vector<int32_t> trainer_rank_of;
  // Worker ranks ordered by their trainer's rank: every mean is summed in
  // trainer order, so its bits do not depend on the order workers joined.
  std::vector<int> reduce_order;
  double ns_seconds = 0;
  int64_t bytes = 0;
};

}  // namespace worker
}  // namespace muonps

#endif  // MUONPS_SERVER_WORKER_STEP_INTERNAL_H_
