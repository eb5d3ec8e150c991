// The JSON line of bench/step_cpu for one configuration: what the trainer
// ranks recorded, reduced to medians, against the one-process peer (see
// step_cpu_bench.cc for what each figure means). Plain functions;
// thread-safe.
#ifndef MUONPS_BENCH_STEP_CPU_STEP_REPORT_H_
#define MUONPS_BENCH_STEP_CPU_STEP_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/step_cpu/step_model.h"
#include "bench/step_cpu/trainer_rank.h"
#include "newton_schulz/options.h"
#include "nlohmann/json.hpp"

namespace muonps {
namespace bench {

// What one configuration measured: the muonps ranks and, interleaved with
// them step by step, the one-process peer.
struct InterleavedRun {
  int worker_openblas_threads = 0;
  std::vector<TrainerRankResult> ranks;
  // The peer's steps in the ranks' timed window, and its parameters after
  // as many steps as the ranks took.
  std::vector<double> peer_step_seconds;
  std::vector<float> peer_final_params;
  std::map<std::string, NsAlgorithm> algorithms;
  int64_t plan_version = 0;
  // Share of the machine other processes used while it ran.
  double foreign_cpu_fraction = 0;
};

// What every line shares.
struct ReportContext {
  std::vector<StepMatrix> matrices;
  std::string widths;
  int warmup_steps = 0;
};

// One "step_cpu" line. `run` holds at least one rank, every rank as many
// timed and probe steps, and final parameters as long as the peer's.
nlohmann::ordered_json StepCpuLine(const InterleavedRun& run,
                                   const ReportContext& context);

}  // namespace bench
}  // namespace muonps

#endif  // MUONPS_BENCH_STEP_CPU_STEP_REPORT_H_
